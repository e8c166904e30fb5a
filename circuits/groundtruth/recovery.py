"""Recovery of planted AF1 structures: run the AF1 search and head pruning on the ground-truth zoo models
(whose structure is known, see :mod:`circuits.zoo.structure` and ``docs/groundtruth.md``) and score what
they find against what was planted.

Per model and ablation (CAMA, plain mean, zero at ``blocks.{wait}.hook_resid_post``):

* the configuration the search selects (grid ``"full"``, threshold ``threshold``) against the planted
  ``(wait, transfer)`` (0-indexed last waiting block; number of transfer blocks);
* greedy head pruning (:mod:`circuits.prune`, heads removed by zero ablation of ``hook_z``) inside the
  selected configuration (the planted one when nothing is selected): the surviving head set at the
  faithfulness target, with precision = |found & planted| / |found| and recall = |found & planted| /
  |planted| over ``(block, head)`` pairs;
* the faithfulness curve ``f(k)`` over the number ``k`` of transfer heads kept (``k = 0 .. K``) and,
  as MIB defines them for circuit sizes, CPR = the area under ``f`` and CMD = the area between ``f`` and
  1, both over the circuit size ``x = k / K`` in [0, 1] (trapezoid rule; :func:`cpr_cmd`). Faithfulness
  is the fraction of base-correct prompts whose answer survives (the full model scores 1), so CPR and
  CMD lie in [0, 1] and CPR + CMD = 1 whenever ``f <= 1``.

Both analyses run through :func:`circuits.runner.execute` (``SEARCH`` and ``PRUNE``), so each writes an
ordinary, resumable run directory under ``<out>/<model>/<ablation>/{search,prune}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from circuits.errors import ArgumentError, ModelLoadError
from circuits.store import files
from circuits.vocab import ABLATIONS, Ablation
from interventions.types import JsonDict, Model

if TYPE_CHECKING:
    from circuits.destinations import Run
    from circuits.prompts.sampling import Prompts
    from circuits.zoo.structure import Structure

__all__ = ["Recovery", "af1_check", "model_folder", "planted_models", "planted_structure", "precision_recall",
           "curve_by_size", "cpr_cmd", "recover", "run_recovery"]



@dataclass
class Recovery:
    """What the search and pruning recover on one planted model with one ablation.

    ``planted``/``selected``: ``(wait, transfer)`` (``selected`` is ``None`` when no configuration reaches
    the threshold); ``faithfulness_planted``: faithfulness of the planted configuration; ``pruned_at``: the
    configuration pruned; ``planted_heads``/``found_heads``: ``(block, head)`` pairs (``found_heads`` is the
    smallest set with faithfulness >= ``target``, ``None`` if none); ``curve``: ``(heads kept,
    faithfulness)`` from 0 heads to all; ``cpr``/``cmd`` as in :func:`cpr_cmd`."""

    model: str
    task: str
    ablation: str
    n_prompts: int
    planted: tuple[int, int]
    selected: tuple[int, int] | None
    faithfulness_planted: float
    pruned_at: tuple[int, int]
    planted_heads: list[tuple[int, int]]
    found_heads: list[tuple[int, int]] | None
    precision: float
    recall: float
    cpr: float
    cmd: float
    target: float
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def config_recovered(self) -> bool:
        """Whether the selected configuration is the planted one."""
        return self.selected == self.planted

    @property
    def heads_recovered(self) -> bool:
        """Whether the surviving head set is exactly the planted one."""
        return self.found_heads is not None and sorted(self.found_heads) == sorted(self.planted_heads)

    def to_dict(self) -> JsonDict:
        d = asdict(self)
        d.update(config_recovered=self.config_recovered, heads_recovered=self.heads_recovered)
        return d


def model_folder(name: str) -> Path:
    """The folder of ``name``: a model folder path as given, else the zoo model's folder."""
    from circuits import zoo

    path = Path(name)
    return path if (path / "config.json").is_file() else zoo.model_dir(name)


def planted_models() -> list[str]:
    """Names of the shipped zoo models with a planted structure: a learned ground truth (``"groundtruth"``
    in ``zoo.json``) or a mask attached by hooks (``"planted"``, the former ``arith-gpt2-af1``)."""
    from circuits import zoo
    from circuits.zoo.hf import read_meta

    return [n for n in zoo.available() if {"groundtruth", "planted"} & set(read_meta(zoo.model_dir(n)))]


def planted_structure(name: str):
    """The planted :class:`~circuits.zoo.structure.Structure` of ``name`` (a zoo model or a model folder).
    A former mask spec (``{"self_all": [...], "last_full": [...]}``, every head of the ``last_full`` blocks
    reading) becomes wait = first ``last_full`` block - 1, transfer = their number, every head of them
    designated. ``ValueError`` if it has none (or the mask is not an AF1 structure)."""
    import json

    from circuits.zoo.hf import read_meta
    from circuits.zoo.structure import Structure

    folder = model_folder(name)
    meta = read_meta(folder)
    if "groundtruth" in meta:
        return Structure.from_dict(meta["groundtruth"])
    if "planted" in meta:
        full = sorted(meta["planted"]["last_full"])
        if not full or full != list(range(full[0], full[-1] + 1)):
            raise ModelLoadError(f"{name}: planted mask {meta['planted']} is not an AF1 structure (last_full must be "
                                 f"consecutive blocks)")
        n_heads = int(json.loads((folder / "config.json").read_text()).get("n_head", 0))
        return Structure(full[0] - 1, len(full), tuple(tuple(range(n_heads)) for _ in full))
    raise ArgumentError(f"model {name!r} has no planted structure; planted zoo models: "
                        f"{', '.join(planted_models()) or '(none)'}")


def precision_recall(found: Sequence[tuple[int, int]] | None,
                     planted: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """``(precision, recall)`` of the head set ``found`` against ``planted`` (``(block, head)`` pairs);
    ``found=None`` (no set reaches the target) scores ``(0, 0)``; an empty ``found`` has precision 1."""
    if found is None:
        return 0.0, 0.0
    f, p = {tuple(h) for h in found}, {tuple(h) for h in planted}
    hit = len(f & p)
    return (hit / len(f) if f else 1.0), (hit / len(p) if p else 1.0)


class SizedPoint(Protocol):
    """A point of a pruning curve as :func:`curve_by_size` reads it."""

    @property
    def n_heads_kept(self) -> int: ...

    @property
    def faithfulness(self) -> float: ...


def curve_by_size(points: Sequence[SizedPoint]) -> list[tuple[int, float]]:
    """``(heads kept, faithfulness)`` of pruning curve points (objects with ``n_heads_kept`` and
    ``faithfulness``, e.g. :class:`circuits.prune.CurvePoint`), sorted by heads kept, 0 first."""
    return sorted((int(p.n_heads_kept), float(p.faithfulness)) for p in points)


def cpr_cmd(curve: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """MIB's circuit-size metrics of a faithfulness curve ``[(size k, f(k)), ...]`` with sizes from 0 to
    the full size ``K`` (the largest ``k``): the sizes are normalised to ``x = k / K`` and

    * CPR = integral of ``f(x)`` over [0, 1] (higher is better),
    * CMD = integral of ``|1 - f(x)|`` over [0, 1] (lower is better),

    both by the trapezoid rule on the given points (``|1 - f|`` is integrated piecewise-linearly between
    points, so a segment that crosses 1 is split at the crossing). ``ValueError`` unless the curve has at
    least two points, starts at size 0 and has distinct sizes."""
    pts = sorted((int(k), float(f)) for k, f in curve)
    ks = [k for k, _ in pts]
    if len(pts) < 2 or ks[0] != 0 or len(set(ks)) != len(ks):
        raise ArgumentError(f"a faithfulness curve needs distinct sizes from 0 up, got sizes {ks}")
    total = ks[-1]
    cpr = cmd = 0.0
    for (k0, f0), (k1, f1) in zip(pts[:-1], pts[1:]):
        w = (k1 - k0) / total
        cpr += w * (f0 + f1) / 2
        d0, d1 = 1 - f0, 1 - f1
        if d0 * d1 >= 0:
            cmd += w * (abs(d0) + abs(d1)) / 2
        else:  # the segment crosses f = 1: two triangles
            t = abs(d0) / (abs(d0) + abs(d1))
            cmd += w * (t * abs(d0) + (1 - t) * abs(d1)) / 2
    return cpr, cmd


def recover(model: Model, name: str, structure: Structure, prompts: Prompts, ablation: Ablation, *, task: str,
            threshold: float = 0.9, target: float = 0.9, out_dir: str | Path | None = None,
            progress: bool = False) -> Recovery:
    """Search (grid ``"full"``) and prune (exact greedy, zero ablation of heads) ``model`` with
    ``ablation`` on ``prompts`` (a :class:`circuits.prompts.Prompts`: one layout, BOS at 0, with the fit set of
    its means, :meth:`circuits.prompts.spec.PromptSpec.prepare`) and score the
    result against ``structure``. ``out_dir``: ``<out_dir>/search`` and ``<out_dir>/prune`` run
    directories (:func:`prune_folder`; ``None``: nothing written)."""
    from circuits.models.spec import LoadedModel
    from circuits.prompts.ready import ReadyPrompts
    from circuits.prune.config import PruneConfig
    from circuits.prune.greedy import PRUNE
    from circuits.runner import RunOptions, run
    from circuits.search.analysis import SEARCH
    from circuits.search.config import SearchConfig

    meta = {"model": name, "task": task, "source": prompts.source, "base_accuracy": prompts.base_accuracy,
            "n_checked": prompts.n_checked, "command": "groundtruth"}
    sub = (lambda d: Path(out_dir) / d) if out_dir is not None else (lambda d: None)
    source = LoadedModel(model, name=name)
    ready = ReadyPrompts(prompts.tokens, prompts.answers, fit=prompts.fit, records=prompts.records(), meta=meta)
    search = run(SEARCH, SearchConfig(threshold=threshold, grid="full", ablation=ablation).validate(), source, ready,
                 RunOptions(out=sub("search"), progress=progress))
    planted = (structure.wait, structure.transfer)
    selected = search.selected.config if search.selected is not None else None
    at = selected if selected is not None and selected[1] >= 1 else planted
    pruned = run(PRUNE, PruneConfig(at[0], at[1], ablation=ablation, method="zero", target=target), source, ready,
                 RunOptions(out=sub(prune_folder(planted, at)), progress=progress))
    heads = sorted(structure.head_set)
    found = (sorted((int(h[0]), int(h[1])) for h in pruned.smallest_head_set)
             if pruned.smallest_head_set is not None else None)
    prec, rec = precision_recall(found, heads)
    curve = curve_by_size(pruned.curve)
    cpr, cmd = cpr_cmd(curve)
    planted_res = search.result(*planted)
    return Recovery(model=name, task=task, ablation=ablation, n_prompts=int(search.n_prompts), planted=planted,
                    selected=selected,
                    faithfulness_planted=float(planted_res.faithfulness) if planted_res else float("nan"),
                    pruned_at=at, planted_heads=heads, found_heads=found, precision=prec, recall=rec,
                    cpr=cpr, cmd=cmd, target=target, curve=curve)


def run_recovery(models: Sequence[str] | None = None, tasks: Sequence[str] = ("add_sub",), n_prompts: int = 200,
                 ablations: Sequence[str] = ABLATIONS, out_dir: str | Path | None = None, seed: int = 0,
                 threshold: float = 0.9, target: float = 0.9, progress: bool = False, log=None,
                 held: Run | None = None) -> list[Recovery]:
    """:func:`recover` for every planted model (zoo names or model folders, e.g. an ``af1 zoo train --out``
    folder; default :func:`planted_models`), task and ablation, on
    ``n_prompts`` prompts per task that the model answers correctly (generated with ``seed``).
    ``out_dir``: run directories under ``<out_dir>/runs/<model>/<task>/<ablation>``; ``out_dir`` is locked
    (:class:`circuits.runner.Run`, or ``held``, one the caller holds) and gets the run identity
    (:func:`identity`) like the directory of any other command."""
    from circuits.runner import Run
    from circuits.store.atomic import safe_name
    from circuits.store.runs import RunDir
    from circuits.validation import check_choice

    for a in ablations:
        check_choice("ablation", a, ABLATIONS)
    names = list(models) if models else planted_models()
    if not names:
        raise ArgumentError("no planted zoo model is installed; give --models (zoo names or model folders)")
    for name in names:
        safe_name(Path(name).name, "model")
    for task in tasks:
        safe_name(task, "task")
    args = dict(names=names, tasks=list(tasks), n_prompts=n_prompts, ablations=list(ablations), out_dir=out_dir,
                seed=seed, threshold=threshold, target=target, progress=progress, log=log)
    if out_dir is None:
        return _run_all(**args)
    ident = identity(names, tasks, n_prompts, ablations, seed, target)
    with Run(out_dir, "groundtruth") if held is None else contextlib.nullcontext():
        # Earlier releases recorded the threshold: their directories resume with any.
        RunDir(out_dir, ident, results_name=files.NO_RESULTS, optional=("threshold",)).open()
        return _run_all(**args)


def identity(models: Sequence[str], tasks: Sequence[str], n_prompts: int, ablations: Sequence[str], seed: int,
             target: float) -> JsonDict:
    """The run identity of ``af1 groundtruth`` (``run.json``): what determines its runs. The threshold is not
    part of it: it only selects among the searches' stored results (every configuration is evaluated), so
    another one reselects without evaluating, and prunes anew only where the selection moved."""
    return {"analysis": "groundtruth", "models": list(models), "tasks": list(tasks), "n_prompts": int(n_prompts),
            "ablations": list(ablations), "seed": int(seed), "target": float(target)}


def prune_folder(planted: tuple[int, int], at: tuple[int, int]) -> str:
    """The pruning run's folder beside ``search``: ``prune`` at the planted configuration, else
    ``prune-w<W>-t<T>`` (another threshold may move the selection, and a pruning run is one configuration's)."""
    return "prune" if tuple(at) == tuple(planted) else f"prune-w{at[0]}-t{at[1]}"


def _run_all(names: Sequence[str], tasks: Sequence[str], n_prompts: int, ablations: Sequence[str],
             out_dir: str | Path | None, seed: int, threshold: float, target: float, progress: bool,
             log: Callable[[str], object] | None) -> list[Recovery]:
    from circuits import timing, zoo
    from circuits.prompts.spec import PromptSpec

    rows = []
    for name in names:
        structure = planted_structure(name)
        with timing.phase("load"):
            model = zoo.load_dir(model_folder(name))
        name = Path(name).name
        for task in tasks:
            # One prompt set for every ablation, drawn as CAMA needs it (each mean backed by enough fit prompts).
            with timing.phase("prompts"):
                prompts = PromptSpec(task, n_prompts, seed).prepare(model, means="cama", progress=progress)
            for a in ablations:
                where = Path(out_dir) / files.RUNS_DIR / name / task / a if out_dir is not None else None
                # ablations were checked against ABLATIONS by run_recovery.
                row = recover(model, name, structure, prompts, cast(Ablation, a), task=task, threshold=threshold,
                              target=target, out_dir=where, progress=progress)
                if log is not None:
                    log(f"{name} {task} {a}: selected {row.selected} (planted {row.planted}), heads "
                        f"{row.found_heads} (planted {row.planted_heads}) P {row.precision:.2f} R {row.recall:.2f} "
                        f"CPR {row.cpr:.3f} CMD {row.cmd:.3f}")
                rows.append(row)
    return rows


def af1_check(model_dir: str | Path, task: str = "add_sub", n_build: int = 4000, threshold: float = 0.9) -> dict:
    """The full-grid AF1 search (CAMA) on the model saved in ``model_dir`` (loaded as ``zoo.load`` does,
    mask attached), on every prompt of ``n_build`` generated ``task`` prompts (seed 0) it answers
    correctly, in their largest layout. Returns the card entry of the planted model: task, grid,
    ablation, threshold, n_prompts, base_accuracy, per-configuration faithfulness (``"wait,transfer"``
    keys), summary line."""
    from circuits import zoo
    from circuits.prompts.sampling import prepare_prompts
    from circuits.search.analysis import search_af1

    model = zoo.load_dir(Path(model_dir))
    p = prepare_prompts(model, task, n_build, seed=0, min_prompts=1)
    res = search_af1(model, p.tokens, p.answers, threshold=threshold, grid="full", progress=False)
    return {"task": task, "grid": "full", "ablation": "cama", "threshold": threshold, "n_prompts": len(p),
            "base_accuracy": round(p.base_accuracy, 4),
            "faithfulness": {f"{r.wait},{r.transfer}": round(r.faithfulness, 4) for r in res.results},
            "summary": res.summary_line()}
