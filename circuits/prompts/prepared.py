"""The prepared prompts of a run, kept in its directory so that a rerun with nothing left to compute does not
check prompts or draw the fit set again.

Preparing a run's prompts (:meth:`circuits.prompts.spec.PromptSpec.prepare`: up to ``--max-checked`` forward passes to
find prompts the model answers correctly, then the fit set of the means) costs seconds on a zoo model and
minutes on a large one, and its result is a function of the model and the prompt spec. So the runner writes
it to ``prepared.safetensors`` (:data:`circuits.store.files.PREPARED`): the scored prompts (tokens, answers, texts,
the sampling counts), the fit set's tokens, which prompts the runner kept (the unmodified model's answer is
the argmax) and the **key** they were prepared under: the model's identity (shapes, fingerprint, the SHA-256
of every weight), its tokenizer, the whole prompt spec (task, count, seed, source, budget, BOS, fit spec,
numbers, format), the task's definition (and the hashes of its task file and frozen set) or the prompt dataset's
content hash, which means the analysis needs and the
package version.

:func:`prepare` reloads the file instead of preparing when its content hash is the one ``artifacts.json``
recorded and its key equals this run's; the runner then binds it to the run identity
(:meth:`circuits.store.runs.RunDir.checked_artifact`: a file written by another run is refused) before anything is
evaluated. Any other file (missing, unrecorded, changed, another key) is ignored and the prompts are prepared
anew, then written over it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool

from circuits.errors import CorruptRunError
from circuits.logs import get_logger
from circuits.store import files
from circuits.tasks.tokens import answer_value
from interventions.types import JsonDict, JsonMapping, Model

if TYPE_CHECKING:
    from circuits.prompts.prompt_files import PromptData
    from circuits.prompts.sampling import Prompts
    from circuits.store.runs import RunDir
    from circuits.tasks.catalogue import TaskLike

__all__ = ["CHECKED", "FORMAT", "Prepared", "cached", "dataset_key", "keep_prepared", "load", "parse", "prepare",
           "prepared_of", "remember", "spec_key", "task_key", "to_bytes"]

FORMAT = 1
"""Version of the file's layout (part of the key)."""
META = "af1.prepared"
"""The safetensors metadata entry holding the JSON description."""
EXTRA = "prepared"
"""The :attr:`circuits.prompts.Prompts.extra` entry where :func:`prepare` leaves the :class:`Prepared`."""

_COUNTS = ("base_accuracy", "n_checked", "n_correct", "task", "source", "seed", "n_layouts", "n_dropped_multi_token",
           "n_drawn", "n_wrong", "prepend_bos", "bos_token", "stop", "n_dropped_fit", "numbers")
"""The :class:`~circuits.prompts.Prompts` fields kept as they are."""


@dataclass
class Prepared:
    """The prompts of a run and where they came from: ``key`` (:func:`spec_key`), ``prompts`` (a
    :class:`~circuits.prompts.Prompts` with its fit set), ``keep`` (``[n]`` bool, the prompts the runner kept,
    when reloaded; ``None``: not known yet) and ``source`` (the file they were reloaded from, ``None``: prepared
    by this run)."""

    key: JsonDict
    prompts: Prompts
    keep: torch.Tensor | None = None
    source: Path | None = None


def prepared_of(prompts: object) -> Prepared | None:
    """The :class:`Prepared` :func:`prepare` attached to ``prompts`` (``None`` for prompts prepared otherwise)."""
    extra = getattr(prompts, "extra", None)
    found = extra.get(EXTRA) if isinstance(extra, dict) else None
    return found if isinstance(found, Prepared) else None


def spec_key(model: Model, spec: Any, means: str | None) -> JsonDict:
    """What the prepared prompts of ``spec`` on ``model`` with ``means`` are a function of (see the module
    docstring), as a JSON object."""
    import interventions as iv
    from circuits import __version__
    from circuits.prompts.datasets import prompts_label
    from circuits.tasks import catalogue as tasks

    tok = getattr(model, "tokenizer", None)
    return _plain({
        "format": FORMAT,
        "version": __version__,
        "model": iv.adapt(model).model_identity(),
        "tokenizer": None if tok is None else {"class": type(tok).__name__, "size": len(tok),
                                               "name": str(getattr(tok, "name_or_path", "")),
                                               "bos": getattr(tok, "bos_token_id", None)},
        "spec": dataclasses.asdict(replace(spec, task=None if spec.task is None else tasks.task_label(spec.task),
                                           prompts=None if spec.prompts is None else prompts_label(spec.prompts),
                                           fit_prompts=fit_label(spec.fit_prompts))),
        "task": task_key(spec.task, spec.source) if spec.prompts is None else {"prompts": dataset_key(spec.prompts)},
        **({} if spec.fit_prompts is None else {"fit_prompts": fit_key(spec.fit_prompts)}),
        "means": means,
    })


def task_key(task: TaskLike, source: str) -> JsonDict:
    """What the prompts of ``task`` (a catalogue name, a task file or a :class:`~circuits.tasks.TaskSpec`) are
    a function of: its name, its definition, the SHA-256 of its task file (a file changed under the same path
    gives another key) and, for ``source="frozen"``, of its frozen set."""
    from circuits.store.runs import file_sha256
    from circuits.tasks import catalogue as tasks

    out: JsonDict = {"name": tasks.task_label(task)}
    if not tasks.known_task(task):  # a caller's own prompt loader may name tasks the catalogue does not hold
        return out
    spec = tasks.get_task(task)
    out["spec"] = _plain(dataclasses.asdict(spec))
    if spec.path is not None and Path(spec.path).is_file():
        out["file_sha256"] = file_sha256(spec.path)
    frozen = tasks.frozen_path(spec)
    if source == "frozen" and frozen.is_file():
        out["frozen_sha256"] = file_sha256(frozen)
    return out


def fit_label(source: TaskLike | PromptData | None) -> str | None:
    """How the fit source of a prompt dataset (``PromptSpec.fit_prompts``) is named: a task's label, a dataset's."""
    from circuits.prompts.datasets import fit_source_label

    return None if source is None else fit_source_label(source)


def fit_key(source: TaskLike | PromptData) -> JsonDict:
    """What a fit set drawn from ``source`` (a prompt dataset or a task) is a function of: as the prompts'."""
    from circuits.prompts.datasets import fit_from_task
    from circuits.tasks.catalogue import TaskSpec

    if fit_from_task(source):
        return task_key(source, "build")
    assert not isinstance(source, TaskSpec)  # a TaskSpec is a task
    return dataset_key(source)


def dataset_key(source: PromptData) -> JsonDict:
    """What prompts drawn from the prompt dataset ``source`` are a function of: its name and the SHA-256 of its
    content (the file's bytes; a ``datasets.Dataset``'s rows), so that a file changed under the same path
    gives another key."""
    from circuits.prompts.datasets import prompts_label
    from circuits.store.runs import file_sha256

    if isinstance(source, (str, Path)):
        from circuits.tasks.package_data import find_file

        path = find_file(source)
        return {"name": prompts_label(source), "sha256": file_sha256(path) if path.is_file() else None}
    rows = json.dumps(source.to_dict(), sort_keys=True, default=str).encode()
    return {"name": prompts_label(source), "sha256": hashlib.sha256(rows).hexdigest()}


def prepare(spec: Any, model: Model, *, means: str | None, out: str | Path | Sequence[Path] | None,
            progress: bool = True, batch_size: int = 128) -> Any:
    """``spec.prepare(model, ...)`` (:meth:`circuits.prompts.spec.PromptSpec.prepare`), or the prompts a run wrote to
    ``out`` (a run directory, or several: the cells of a sweep that share these prompts) under the same key
    (:func:`load`). The returned prompts carry their :class:`Prepared` (:func:`prepared_of`), which the runner
    writes or checks (:func:`keep_prepared`)."""
    key = spec_key(model, spec, means)
    folders = [out] if isinstance(out, (str, Path)) else list(out or [])
    found = next((p for p in (load(f, key) for f in folders) if p is not None), None)
    if found is None:
        found = cached(key)
    if found is None:
        prompts: Prompts = spec.prepare(model, means=means, progress=progress, batch_size=batch_size)
        if not isinstance(getattr(prompts, "extra", None), dict) or not dataclasses.is_dataclass(prompts):
            return prompts  # not a Prompts (a caller's own loader): nothing to keep
        found = Prepared(key, prompts)
    found.prompts = replace(found.prompts, extra={**found.prompts.extra, EXTRA: found})
    return found.prompts


def load(folder: str | Path, key: JsonMapping) -> Prepared | None:
    """The prepared prompts in ``folder`` when its ``prepared.safetensors`` is the file a run recorded in
    ``artifacts.json`` (by its SHA-256) and was written under ``key``; ``None`` otherwise. A recorded file whose
    content does not hold together raises :class:`~circuits.errors.CorruptRunError` naming it."""
    from circuits.store.runs import read_json_object

    path = Path(folder) / files.PREPARED
    artifacts_path = Path(folder) / files.ARTIFACTS
    if path.is_symlink() or not path.is_file() or not artifacts_path.is_file():
        return None
    try:
        recorded = read_json_object(artifacts_path).get(files.PREPARED)
    except CorruptRunError:
        return None
    data = path.read_bytes()
    if not isinstance(recorded, str) or hashlib.sha256(data).hexdigest() != recorded:
        return None
    return parse(data, key, path)


def parse(data: bytes, key: JsonMapping, path: Path) -> Prepared | None:
    """The prepared prompts of a file's bytes ``data`` (read from ``path``) when they were written under ``key``
    (``None`` otherwise); :class:`~circuits.errors.CorruptRunError` naming ``path`` when they do not hold
    together."""
    from safetensors import SafetensorError
    from safetensors.torch import load as load_bytes

    try:
        tensors = load_bytes(data)
        meta = json.loads(_metadata(data)[META])
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:  # no parse
        raise CorruptRunError(f"{path} cannot be read ({' '.join(str(err).split())[:120]}): move it away to prepare "
                              f"the prompts again") from None
    if _canonical(meta.get("key")) != _canonical(key):
        return None
    return Prepared(key=dict(key), prompts=_prompts(path, tensors, meta), keep=tensors["keep"].bool(), source=path)


def keep_prepared(run_dir: RunDir, prepared: Prepared, keep: Bool[torch.Tensor, " n"]) -> None:
    """After the run identity is checked: a reloaded file must be bound to it
    (:meth:`~circuits.store.runs.RunDir.checked_artifact` refuses another run's); prompts prepared by this run (or
    reloaded from another folder, a sweep's cell of the same prompts) are written to ``run_dir`` with ``keep``
    (``[n]`` bool, the prompts the runner kept) and their hash recorded."""
    from circuits.store.atomic import write_bytes

    target = run_dir.path / files.PREPARED
    if prepared.source is not None and prepared.source == target:
        run_dir.checked_artifact(files.PREPARED)
        return
    write_bytes(target, to_bytes(prepared, keep))
    run_dir.record_artifact(files.PREPARED)


CHECKED = {"keep": "base_correct"}
"""What the user cache's key of prepared prompts adds to :func:`spec_key`: their ``keep`` is the runner's
check of which prompts the unmodified model answers (an analysis that scores every prompt keeps them all, and is
not cached)."""


def cached(key: JsonMapping) -> Prepared | None:
    """The prepared prompts an earlier command kept in the user's cache (:mod:`circuits.store.usercache`) under
    ``key`` (and :data:`CHECKED`), verified by hash; ``None`` when there are none (or the entry was corrupt: removed,
    with a line)."""
    from circuits.store import usercache

    full = {**key, **CHECKED}
    data = usercache.get("prompts", full)
    if data is None:
        return None
    path = usercache.results_root() / "prompts" / (usercache.key_sha256(full) + usercache.DATA)
    try:
        found = parse(data, key, path)
    except CorruptRunError:
        found = None
    if found is None:
        get_logger("cache").warning("cached prompts %s... do not hold together: preparing them again", path.stem[:12])
        usercache.discard("prompts", full)
        return None
    get_logger("runner").info("prompts and fit set: reloaded from the cache %s (prepared and checked by an earlier "
                              "command on this model and prompt spec; af1 cache clear removes it)",
                              usercache.results_root())
    return found


def remember(prepared: Prepared, keep: Bool[torch.Tensor, " n"], label: str | None = None) -> None:
    """Keep ``prepared`` with ``keep`` (``[n]`` bool: the prompts the unmodified model answers, as the runner
    checked them) in the user's cache, for the next command on the same model and prompt spec (``label``: the
    model's name in ``af1 cache list``)."""
    from circuits.store import usercache

    if usercache.limit_bytes() == 0 or prepared.source is not None and prepared.keep is not None and \
            torch.equal(prepared.keep.bool().cpu(), keep.bool().cpu()) and _in_cache(prepared.source):
        return
    p = prepared.prompts
    about = (f"prompts of {label or 'a model'} on {p.task} ({len(p)} of {p.n_checked} checked, base accuracy "
             f"{p.base_accuracy:.1%})")
    usercache.put("prompts", {**prepared.key, **CHECKED}, to_bytes(prepared, keep), about)


def _in_cache(path: Path) -> bool:
    from circuits.store import usercache

    return usercache.results_root() in Path(path).parents


def to_bytes(prepared: Prepared, keep: Bool[torch.Tensor, " n"]) -> bytes:
    """The ``prepared.safetensors`` form of ``prepared`` with ``keep`` (``[n]`` bool, the prompts the runner kept)."""
    from safetensors.torch import save

    p = prepared.prompts
    tensors = {"tokens": p.tokens.long().contiguous(), "answers": torch.as_tensor(p.answers).long().contiguous(),
               "keep": keep.to(torch.uint8).contiguous()}
    if p.fit is not None:
        tensors["fit_tokens"] = p.fit.tokens.long().contiguous()
    meta = {"key": prepared.key, "prompts": list(p.prompts),
            "answer_values": [answer_value(v) for v in p.answer_values],
            "answer_texts": None if p.answer_texts is None else list(p.answer_texts), "layout": _plain(p.layout),
            "counts": _plain({k: getattr(p, k) for k in _COUNTS}),
            "fit": None if p.fit is None else {"spec": p.fit.spec.identity(), "task": p.fit.task,
                                               "whole": bool(p.fit.whole), "n_drawn": int(p.fit.n_drawn)}}
    return save(tensors, metadata={META: json.dumps(meta, sort_keys=True)})


def _prompts(path: Path, tensors: dict[str, torch.Tensor], meta: JsonDict) -> Prompts:
    """The :class:`~circuits.prompts.Prompts` of a file, after checking that its parts hold together."""
    from circuits.prompts.fitset import FitSet, FitSpec
    from circuits.prompts.sampling import Prompts
    from circuits.tasks.formats import PromptFormat

    def bad(what: str) -> CorruptRunError:
        return CorruptRunError(f"{path}: {what}; move it away to prepare the prompts again")

    tokens, answers, keep = (tensors.get(k) for k in ("tokens", "answers", "keep"))
    if tokens is None or answers is None or keep is None or tokens.ndim != 2:
        raise bad("tensors tokens [n, pos], answers and keep are needed")
    n = int(tokens.shape[0])
    texts, values = meta.get("prompts"), meta.get("answer_values")
    if answers.shape[0] != n or keep.shape != (n,) or not isinstance(texts, list) or len(texts) != n or \
            not isinstance(values, list) or len(values) != n:
        raise bad(f"its parts disagree on the number of prompts ({n})")
    if any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in values):
        raise bad("answer_values must be integers or strings (the answers of a task of text answers)")
    raw_counts = meta.get("counts")
    counts: JsonDict = raw_counts if isinstance(raw_counts, dict) else {}
    spec = meta["key"]["spec"]
    fit = None
    if meta.get("fit") is not None:
        fit_tokens = tensors.get("fit_tokens")
        if fit_tokens is None or fit_tokens.ndim != 2 or fit_tokens.shape[1] != tokens.shape[1]:
            raise bad("fit_tokens is missing or not of the prompts' layout")
        f = meta["fit"]
        fit = FitSet(tokens=fit_tokens.long(), spec=FitSpec(**f["spec"]), task=f.get("task"),
                     whole=bool(f.get("whole")), n_drawn=int(f.get("n_drawn", 0)))
    fmt = spec.get("format")
    return Prompts(tokens=tokens.long(), answers=answers.long(), prompts=[str(t) for t in texts],
                   answer_values=list(values), answer_texts=meta.get("answer_texts"),
                   layout=_tuples(meta.get("layout")), fit=fit,
                   fmt=PromptFormat(**fmt) if isinstance(fmt, dict) else None,
                   **{k: counts[k] for k in _COUNTS if k in counts})


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return header.get("__metadata__") or {}


def _plain(value: object) -> Any:
    """``value`` as JSON would hold it (tuples as lists, anything else unknown as its text)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True)


def _tuples(value: object) -> object:
    """JSON lists back as tuples (a layout key)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
