"""One runner for every analysis: specs -> model -> prompts -> means -> analysis -> store -> summary -> report.

An analysis is pure (:class:`circuits.analyses.Analysis`): ``run(model, config, ctx)`` takes the model, a
frozen config and a :class:`RunContext` (the base-correct prompts, the means cache, a result store) and
returns a result; it opens no file. The runner does everything around it, the same way for every command.

:func:`run_analysis` starts from what a run is made of: a :class:`~circuits.models.spec.ModelSpec` (or a loaded
model) and a :class:`~circuits.prompts.spec.PromptSpec` (or prepared prompts); the commands and the sweep build
these once and call it:

1. hold the output directory (:class:`Run`: its lock, a directory of another command refused at once);
2. load the model (:meth:`ModelSpec.load <circuits.models.spec.ModelSpec.load>`, after the memory estimate) and
   prepare the prompts with the fit set the analysis's means need (:func:`circuits.prompts.prepared.prepare`:
   reloaded from the directory when an earlier run prepared them under the same key);
3. :func:`execute` with the batch size (``"auto"``: sized to the device, halved on out-of-memory errors,
   :func:`circuits.models.memory.run_batched`).

:func:`execute` starts from tensors (the Python API: ``search_af1`` and the others) and is its steps:

1. :func:`scored_context`: validate the config against the model (the config's ``validate``, the one check of
   its values) and the inputs (answers, BOS, padding); keep the prompts the unmodified model answers
   correctly (once; a rerun reloads which they are with the prepared prompts, :mod:`circuits.prompts.prepared`);
2. :func:`circuits.means.plan_means`, when the analysis needs means: the fit set without the scored prompts
   (:mod:`circuits.prompts.fitset`), every mean a scored prompt reads backed by ``min_count`` fit prompts;
3. :func:`destination`: with an output directory, refuse one of an earlier version's means, build the run
   identity (:attr:`Analysis.identity`, which records the fit set) and check or write ``run.json``
   (:class:`Directory`); without, nothing is written (:class:`Memory`);
4. the means (:func:`circuits.means.load_means`: the cache this run wrote is reloaded, checked by content hash
   and fit-set digests, instead of refitted), then the prepared prompts (written, or the reloaded ones
   checked to be this run's) and the store: resumed records validated against the analysis's schema,
   appends crash-safe and fsynced;
5. run the analysis;
6. write its outputs (:attr:`Analysis.write`: summary and report).

File names live in :mod:`circuits.store.files`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Int

import interventions as iv
from circuits.analyses import Analysis, AnalysisConfig, DirStore, MemoryStore, ResultStore, RunContext
from circuits.errors import ArgumentError, CorruptRunError, PromptError, RunMismatchError
from circuits.faithfulness import base_correct
from circuits.logs import get_logger
from circuits.means import check_current, keep_means, load_means, plan_means
from circuits.prompts.fitset import FitSet
from circuits.prompts.prepared import keep_prepared
from circuits.store import files
from circuits.store.atomic import clean_temporaries, refuse_links
from circuits.store.lock import DirLock
from circuits.store.runs import RunDir, read_json_object
from interventions.validation import check_answers, check_layout, check_tokens, special_token_ids

__all__ = ["LABELS", "Directory", "Memory", "Run", "check_inputs", "command_of", "destination", "execute", "hold",
           "run_analysis", "scored_context"]
# Analysis, RunContext and the stores are defined in circuits.analyses (the contract); this module uses them.

LABELS = ("model", "task", "source", "numbers", "format")
"""The caller's names of the model and the prompts (``meta``): the model's signature and fingerprint and the
prompts' hash already determine the results, so they are compared only when both identities hold them."""


def check_inputs(model: Any, tokens: Any,
                 answers: Any) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, " batch *k"]]:
    """Tokens and answers checked as the analyses need them: a ``[batch, pos]`` id tensor of one layout
    with BOS at position 0 and no padding, and one answer token id per prompt."""
    info = iv.adapt(model).info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = check_answers(answers, int(tokens.shape[0]), info.d_vocab)
    bos_id, pad_id = special_token_ids(model)
    check_layout(tokens, bos_id=bos_id, pad_id=pad_id)
    return tokens, answers


def command_of(identity: Mapping[str, Any]) -> str:
    """Which command wrote a ``run.json`` (identities of the first releases carry no ``analysis`` key:
    prune's has ``command: "prune"``, the search's neither)."""
    if isinstance(identity.get("analysis"), str):
        return identity["analysis"]
    if identity.get("command") == "prune":
        return "prune"
    return "search"


class Run:
    """An output directory held for one command: ``with Run(out, "search") as run:`` creates the directory
    if needed, takes its lock, and refuses at once a directory that holds another command's results (so
    a model is not loaded in vain). On exit the lock is released; a directory this run created and left
    empty is removed again."""

    def __init__(self, out: str | Path, command: str):
        if not str(out).strip():
            raise ArgumentError("--out must be a non-empty path")
        self.path = Path(out)
        self.command = command
        self.created = False
        self.lock: DirLock | None = None

    def __enter__(self) -> Run:
        if self.path.exists() and not self.path.is_dir():
            raise RunMismatchError(f"--out {self.path} exists and is not a directory; choose a directory")
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = DirLock(self.path).acquire()
        try:
            refuse_links(self.path)
            clean_temporaries(self.path)
            ident = self.path / files.IDENTITY
            if ident.exists():
                try:
                    theirs = command_of(read_json_object(ident))
                except CorruptRunError as err:
                    raise RunMismatchError(str(err)) from None
                if theirs != self.command:
                    raise RunMismatchError(
                        f"output directory {self.path} holds results of a different command (`af1 {theirs}`, not "
                        f"`af1 {self.command}`); "
                        f"use a new --out directory"
                    )
            elif any(p.name in files.RESULT_FILES for p in self.path.iterdir()):
                raise RunMismatchError(
                    f"{self.path} holds af1 results but no {files.IDENTITY}: cannot tell which command wrote them; "
                    f"use a new --out directory"
                )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()


@contextlib.contextmanager
def hold(out: str | Path | None, command: str, held: Run | None = None) -> Iterator[Run | None]:
    """The :class:`Run` of ``out`` for ``command``: ``held`` when the caller already holds it, else taken here
    (and released on exit); ``None`` without an output directory."""
    if out is None or held is not None:
        yield None if out is None else held
        return
    with Run(out, command) as run:
        yield run


class Memory:
    """Where a run without an output directory keeps things: its records in memory, nothing written."""

    run_dir: RunDir | None = None

    def open(self, analysis: Analysis[Any, Any], identity: Callable[[], dict[str, Any]]) -> None:
        """Nothing to check (the identity is not even built)."""

    def store(self, schema: Callable[[], Any]) -> ResultStore:
        return MemoryStore()

    def keep_means(self, cache: iv.MeanCache) -> None:
        """Nothing to keep."""

    def keep_prepared(self, prepared: Any, keep: Bool[torch.Tensor, " n"]) -> None:
        """Nothing to keep."""

    def write_prompts(self, records: list[dict[str, Any]] | None) -> None:
        """Nothing to write."""

    def write(self, analysis: Analysis[Any, Any], result: Any, ctx: RunContext) -> None:
        """Nothing to write."""


class Directory(Memory):
    """A run directory: ``run.json`` checked or written, the means and the prepared prompts kept, records
    appended to the analysis's results file, the outputs written (:mod:`circuits.store.runs`)."""

    def __init__(self, path: Path):
        self.path = path
        self.results_file: str | None = None

    def open(self, analysis: Analysis[Any, Any], identity: Callable[[], dict[str, Any]]) -> None:
        """Refuse a directory of an earlier version's means, then check ``run.json`` against ``identity()`` (or
        write it)."""
        check_current(self.path)
        self.results_file = analysis.results_file
        self.run_dir = RunDir(self.path, identity(), results_name=analysis.results_file or files.NO_RESULTS,
                              optional=LABELS + analysis.optional_identity).open()

    def store(self, schema: Callable[[], Any]) -> ResultStore:
        assert self.run_dir is not None
        return DirStore(self.run_dir, schema()) if self.results_file is not None else MemoryStore()

    def keep_means(self, cache: iv.MeanCache) -> None:
        assert self.run_dir is not None
        keep_means(self.run_dir, cache)

    def keep_prepared(self, prepared: Any, keep: Bool[torch.Tensor, " n"]) -> None:
        assert self.run_dir is not None
        keep_prepared(self.run_dir, prepared, keep)

    def write_prompts(self, records: list[dict[str, Any]] | None) -> None:
        if records is not None:
            assert self.run_dir is not None
            self.run_dir.write_jsonl(files.PROMPTS, records)

    def write(self, analysis: Analysis[Any, Any], result: Any, ctx: RunContext) -> None:
        assert self.run_dir is not None
        analysis.write(result, self.run_dir, ctx)


@contextlib.contextmanager
def destination(out_dir: str | Path | None, command: str, held: Run | None = None) -> Iterator[Memory]:
    """Where a run's results go: a :class:`Directory` (held for ``command`` while the run lasts, see
    :func:`hold`) or, without ``out_dir``, :class:`Memory`."""
    with hold(out_dir, command, held) as run:
        yield Memory() if run is None else Directory(run.path)


def execute(
    analysis: Analysis[Any, Any],
    model: Any,
    tokens: Any,
    answers: Any,
    config: Any,
    *,
    out_dir: str | Path | None = None,
    cache: iv.MeanCache | None = None,
    fit: FitSet | None = None,
    min_count: int | None = None,
    meta: Mapping[str, Any] | None = None,
    prompts: Sequence[Mapping[str, Any]] | None = None,
    progress: bool = True,
    held: Run | None = None,
    prepared: Any = None,
    on_means: Callable[[iv.MeanCache], None] | None = None,
    spec: Any = None,
) -> Any:
    """Run ``analysis`` with ``config`` on ``tokens``/``answers`` (its steps: see the module docstring).

    ``out_dir``: the run directory (``None``: nothing is written, records are kept in memory).
    ``fit``: the :class:`~circuits.prompts.fitset.FitSet` the means are fitted on (the scored prompts are removed
    from it); ``cache``: a means cache to use instead (named by its hash in the identity), or, with ``fit``,
    the cache already fitted on it (several analyses of one prompt set share it). ``min_count``: fit
    prompts each mean needs (default: the fit set's, else :data:`~circuits.prompts.fitset.DEFAULT_MIN_COUNT`).
    ``meta``: the caller's description, copied into the identity (except ``command``, ``base_accuracy``
    and ``n_checked``, which describe a run rather than determine it) and the summary. ``prompts``:
    records aligned with ``tokens`` for ``prompts.jsonl``. ``held``: a :class:`Run` the caller already
    holds for ``out_dir`` (commands take the lock before loading the model). ``prepared``: the
    :class:`~circuits.prompts.prepared.Prepared` of ``tokens`` (:func:`circuits.prompts.prepared.prepare`): written to
    the run directory (or, reloaded from it, checked against the run identity), and, when reloaded, its record of which
    prompts the unmodified model answers correctly is used instead of checking them again. ``on_means``: called
    with the means cache the run uses (a caller running several analyses on one fit set fits it once).
    ``spec``: the :class:`~circuits.prompts.spec.PromptSpec` the prompts were prepared from (``RunContext.spec``).
    """
    ctx = scored_context(analysis, model, tokens, answers, config, meta=meta, prompts=prompts, progress=progress,
                         keep=known_keep(prepared, tokens))
    ctx.spec = spec
    needs_means = analysis.needs_means(config)
    if needs_means:
        plan_means(ctx, conditional=analysis.conditional_means(config), fit=fit, cache=cache, min_count=min_count)
    with destination(out_dir, analysis.name, held) as dest:
        dest.open(analysis, lambda: analysis.identity(config, ctx, model))
        if needs_means:
            ctx.cache = load_means(model, ctx, cache, dest.run_dir, batch_size=config.batch_size, progress=progress)
            dest.keep_means(ctx.cache)
            if on_means is not None:
                on_means(ctx.cache)
        if prepared is not None:
            dest.keep_prepared(prepared, ctx.keep)
        ctx.store = dest.store(lambda: analysis.schema(config, info_of(model), int(ctx.tokens.shape[0])))
        dest.write_prompts(analysis.prompt_records(ctx))
        result = analysis.run(model, config, ctx)
        dest.write(analysis, result, ctx)
        return result


def info_of(model: Any) -> Any:
    return iv.adapt(model).info


def known_keep(prepared: Any, tokens: Any) -> Bool[torch.Tensor, " n"] | None:
    """Which of ``tokens`` the unmodified model answers correctly, as the reloaded prepared prompts recorded it
    (``None``: not known, or ``tokens`` are not those prompts)."""
    if prepared is None or prepared.keep is None or not torch.is_tensor(tokens):
        return None
    return prepared.keep if torch.equal(tokens.cpu().long(), prepared.prompts.tokens.cpu().long()) else None


def scored_context(analysis: Analysis[Any, Any], model: Any, tokens: Any, answers: Any, config: Any, *,
                   meta: Mapping[str, Any] | None,
                   prompts: Sequence[Mapping[str, Any]] | None, progress: bool,
                   keep: Bool[torch.Tensor, " n"] | None = None) -> RunContext:
    """Validate ``config`` (:attr:`Analysis.validate`) and the inputs, keep the prompts the unmodified model
    answers correctly (when the analysis scores only those; ``keep``: which they are, known from an earlier run
    of the same model on the same prompts) and return the :class:`RunContext` (without means yet)."""
    analysis.validate(config, info_of(model))
    tokens, answers = check_inputs(model, tokens, answers)
    if prompts is not None and len(prompts) != tokens.shape[0]:
        raise ArgumentError(f"prompts has {len(prompts)} records for {tokens.shape[0]} prompts")
    if analysis.base_correct_only and keep is not None and keep.shape == (tokens.shape[0],):
        keep = keep.bool().cpu()
    elif analysis.base_correct_only:
        keep = base_correct(model, tokens, answers, batch_size=config.batch_size)
    else:
        keep = torch.ones(tokens.shape[0], dtype=torch.bool)
    if not bool(keep.any()):
        raise PromptError(
            f"the unmodified model answers none of the {tokens.shape[0]} prompts correctly: nothing to "
            f"{analysis.name}; check that the answers are the model's answer token ids and that the prompts "
            f"start with BOS"
        )
    return RunContext(
        tokens=tokens[keep], answers=answers[keep], n_given=int(tokens.shape[0]), keep=keep,
        given_tokens=tokens, given_answers=answers, cache=None, store=MemoryStore(), progress=progress,
        meta=dict(meta or {}), prompts=prompts, tokenizer=getattr(model, "tokenizer", None),
    )


# --- from specs --------------------------------------------------------------------------------------------
def run_analysis(analysis: Analysis[Any, Any], model: Any, prompts: Any, config: AnalysisConfig, *,
                 out: str | Path | None = None, batch_size: int | str | None = None, progress: bool = True,
                 command: Sequence[str] | None = None, name: str | None = None, spec: Any = None,
                 cache: iv.MeanCache | None = None, on_means: Callable[[iv.MeanCache], None] | None = None,
                 held: Run | None = None) -> Any:
    """Run ``analysis`` with ``config`` from what the run is made of (the steps: see the module docstring).

    ``model``: a :class:`~circuits.models.spec.ModelSpec` (loaded here, after the memory estimate) or a loaded model
    (then ``name`` names it in the run's description); ``prompts``: a :class:`~circuits.prompts.spec.PromptSpec`
    (prepared here with the fit set the analysis's means need, or reloaded from ``out``) or prepared
    :class:`~circuits.prompts.Prompts` (then ``spec`` is the prompt spec they were prepared from).
    ``out``: the run directory (``None``: nothing written); ``batch_size``: an integer or ``"auto"``
    (default: the config's); ``command``: the command line, recorded in ``summary.json``; ``cache`` /
    ``on_means``: a means cache already fitted on the prompts' fit set / called with the one the run uses
    (:func:`execute`); ``held``: the :class:`Run` of ``out`` when the caller holds it already.
    """
    from circuits.models import memory
    from circuits.models.spec import ModelSpec
    from circuits.prompts.prepared import prepared_of
    from circuits.prompts.spec import PromptSpec

    requested = config.batch_size if batch_size is None else batch_size
    first = memory.AUTO_CPU_BATCH if requested == "auto" else int(requested)  # auto: sized once the model is loaded
    means = analysis.means(config)
    spec = prompts if isinstance(prompts, PromptSpec) else spec
    meta: dict[str, Any] = {"model": model.name if isinstance(model, ModelSpec) else name,
                            **(spec.meta() if spec is not None else {})}
    with hold(out, analysis.name, held) as run:
        loaded = model.load(estimate=spec, batch_size=first, means=means is not None) \
            if isinstance(model, ModelSpec) else model
        if isinstance(prompts, PromptSpec):
            prompts = prepare_prompts(prompts, loaded, meta["model"], means=means, out=out, progress=progress,
                                      batch_size=first)
        meta.update(base_accuracy=prompts.base_accuracy, n_checked=prompts.n_checked,
                    **({"command": list(command)} if command is not None else {}))
        dtype = model.dtype if isinstance(model, ModelSpec) else None
        result = memory.run_batched(requested, loaded, prompts.tokens, dtype, lambda size: execute(
            analysis, loaded, prompts.tokens, prompts.answers, replace(config, batch_size=size),  # type: ignore[type-var]
            out_dir=out, held=run, fit=prompts.fit, cache=cache, on_means=on_means, meta=meta,
            prompts=prompts.records(), progress=progress, prepared=prepared_of(prompts), spec=spec))
    usage = getattr(loaded, "usage", None)
    if getattr(loaded, "remote", False) and usage is not None:
        get_logger("runner").info("remote usage of this run (prompt preparation included): %s requests, %s prompt "
                                  "tokens", usage.requests, f"{usage.tokens:,}")
    return result


def prepare_prompts(spec: Any, model: Any, name: str | None, *, means: str | None, out: str | Path | None,
                    progress: bool, batch_size: int) -> Any:
    """The prompts of ``spec`` with the fit set of ``means`` (:func:`circuits.prompts.prepared.prepare`: reloaded from
    ``out`` when prepared there under the same key); says what it uses (the ``circuits.runner`` logger)."""
    from circuits.prompts import prepared

    prompts = prepared.prepare(spec, model, means=means, out=out, progress=progress, batch_size=batch_size)
    kept = prepared.prepared_of(prompts)
    lines = [f"prompts and fit set: reloaded from {kept.source} (prepared by an earlier run of this command)"] \
        if kept is not None and kept.source is not None else []
    lines.append(f"{name} on {spec.label}: base accuracy {prompts.base_accuracy:.1%} ({prompts.n_correct}/"
                 f"{prompts.n_checked} checked prompts); using {len(prompts)} prompts of {prompts.tokens.shape[1]} "
                 f"tokens ({prompts.n_layouts} layout(s))")
    if prompts.fit is not None:
        fit = prompts.fit
        how = "the whole layout" if fit.whole else f"a sample (seed {fit.spec.seed})"
        dropped = (f"; {prompts.n_dropped_fit} correct prompt(s) set aside: a mean they read has fewer than "
                   f"{fit.spec.min_count} fit prompts" if prompts.n_dropped_fit else "")
        lines.append(f"means: fitted on {len(fit)} prompts of {spec.label} ({how}, population "
                     f"{fit.spec.population}), none of them scored{dropped}")
    get_logger("runner").info("\n".join(lines))
    return prompts
