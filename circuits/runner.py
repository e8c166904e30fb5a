"""One runner for every analysis: prompts -> model -> analysis -> store -> summary -> report.

An analysis is pure: :attr:`Analysis.run` takes the model, the base-correct prompts, a frozen config and
a :class:`RunContext` (means cache, result store, progress) and returns a result; it opens no file. The
runner does everything around it, the same way for every command:

1. validate the config against the model and the inputs (``n_boot``, batch size, answers, BOS, padding);
2. keep the prompts the unmodified model answers correctly (once; a rerun reloads which they are with the
   prepared prompts, :mod:`circuits.prepared`);
3. the means (:mod:`circuits.means`), when the analysis needs them: fitted on the fit set without the
   scored prompts (:mod:`circuits.fitset`), every mean a scored prompt reads backed by ``min_count`` fit
   prompts; with an output directory the cache this run wrote is reloaded (checked by content hash and
   fit-set digests) instead of refitted;
4. with an output directory: take its lock (:class:`circuits.lock.DirLock`), refuse a directory of
   another command (or of an earlier version's means) early, build the run identity
   (:attr:`Analysis.identity`, which records the fit set), check or write ``run.json``, validate resumed
   records against the analysis's schema;
5. write the prepared prompts (or check that the reloaded ones are this run's), then run the analysis with a
   :class:`ResultStore` (appends are crash-safe and fsynced);
6. write the summary and the report (:attr:`Analysis.write`).

File names live in :mod:`circuits.files`. A new analysis is one module that defines an :class:`Analysis`
plus one command module.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch

import interventions as iv
from circuits import files
from circuits.atomic import clean_temporaries, refuse_links
from circuits.errors import ArgumentError, CorruptRunError, PromptError, RunMismatchError
from circuits.faithfulness import base_correct
from circuits.fitset import FitSet
from circuits.means import check_current, keep_means, load_means, plan_means
from circuits.prepared import keep_prepared
from circuits.lock import DirLock
from circuits.records import RecordSchema
from circuits.runs import IDENTITY_FILE, RunDir, read_json_object
from interventions.coverage import Coverage
from interventions.validation import check_answers, check_layout, check_positive, check_tokens, special_token_ids


class ResultStore(Protocol):
    """Where an analysis keeps the records it has finished, so that a rerun resumes.

    ``records()`` returns the finished records (validated); ``append(record)`` persists one at once.
    """

    def records(self) -> list[dict[str, Any]]: ...

    def append(self, record: Mapping[str, Any]) -> None: ...


class MemoryStore:
    """A :class:`ResultStore` in memory (no output directory)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def records(self) -> list[dict[str, Any]]:
        return list(self.rows)

    def append(self, record: Mapping[str, Any]) -> None:
        self.rows.append(dict(record))


class DirStore:
    """A :class:`ResultStore` backed by a run directory's JSONL results file, validated on read."""

    def __init__(self, run_dir: RunDir, schema: RecordSchema | None):
        self.run_dir = run_dir
        numbered = run_dir.load_numbered_records()
        self.loaded = schema.validate(run_dir.results_path, numbered) if schema else [r for _, r in numbered]

    def records(self) -> list[dict[str, Any]]:
        return list(self.loaded)

    def append(self, record: Mapping[str, Any]) -> None:
        self.run_dir.append(record)


@dataclass
class RunContext:
    """What the runner hands an analysis besides the prompts and the config.

    ``tokens``/``answers``: the base-correct prompts (``[n, pos]`` / ``[n]``); ``n_given``: prompts before
    that filter; ``prompts``: caller records aligned with the *given* prompts (or ``None``); ``keep``:
    ``[n_given]`` bool, which were kept; ``cache``: the means cache (or ``None``); ``store``: finished
    records; ``progress``: show bars; ``meta``: the caller's description (model, task, source, command).
    """

    tokens: torch.Tensor
    answers: torch.Tensor
    n_given: int
    keep: torch.Tensor
    given_tokens: torch.Tensor
    given_answers: torch.Tensor
    cache: iv.MeanCache | None
    store: ResultStore
    progress: bool
    meta: dict[str, Any] = field(default_factory=dict)
    prompts: Sequence[Mapping[str, Any]] | None = None
    fit: FitSet | None = None
    coverage: Coverage | None = None
    means_identity: dict[str, Any] | None = None
    tokenizer: Any = None

    def means_summary(self) -> dict[str, Any] | None:
        """What ``summary.json`` says of the means (``None`` without): the fit set (how it was drawn, its
        size and hash) and the fit counts behind the means the scored prompts read."""
        if self.cache is None or self.coverage is None:
            return None
        return {**(self.means_identity or {}), "coverage": self.coverage.summary(self.tokenizer)}

    def means_note(self) -> str | None:
        """One line for a report: the fit set and its counts (``None`` without means)."""
        if self.coverage is None:
            return None
        fit = self.fit
        how = ("the caller's cache" if fit is None else
               f"{len(fit)} fit prompts ({'the whole layout' if fit.whole else 'a sample'} of task {fit.task}, "
               f"population {fit.spec.population}, seed {fit.spec.seed})" if fit.task else f"{len(fit)} given fit prompts")
        return f"Means: {how}, none of them scored; {self.coverage.line()}."

    @property
    def kept_prompts(self) -> list[dict[str, Any]] | None:
        """The caller's prompt records of the kept prompts (``None`` without records)."""
        if self.prompts is None:
            return None
        return [dict(p) for p, k in zip(self.prompts, self.keep.tolist()) if k]


@dataclass(frozen=True)
class Analysis:
    """An analysis as the runner sees it.

    ``name``: the command (``"search"``); ``results_file``: its JSONL results (``None``: no resumable
    records); ``validate(config, info)``: raise on a config that does not fit the model (default:
    ``config.validate(info)``); ``needs_means(config)``: whether it needs a :class:`~interventions.MeanCache`
    (default: ``config.needs_means``, else no); ``identity(config, ctx, model)``: the run identity (what
    determines the results); ``schema(config, info, n_prompts)``: the records' schema (default: none); ``run(model, config, ctx)``: the pure analysis; ``write(result, run_dir,
    ctx)``: summary and report; ``prompt_records(ctx)``: the ``prompts.jsonl`` records (``None``: none);
    ``base_correct_only``: run on the prompts the unmodified model answers correctly (``False``: on all).
    ``optional_identity``: identity keys compared only when both the directory's ``run.json`` and this run
    hold them (:data:`LABELS`: names the rest of the identity pins down, so that a run of the Python API,
    which has no command-line names, and one of the command line share a directory; plus keys earlier
    releases recorded that no longer determine the results).
    """

    name: str
    results_file: str | None
    identity: Callable[[Any, RunContext, Any], dict[str, Any]]
    run: Callable[[Any, Any, RunContext], Any]
    write: Callable[[Any, RunDir, RunContext], None]
    validate: Callable[[Any, Any], None] = lambda config, info: config.validate(info)
    needs_means: Callable[[Any], bool] = lambda config: bool(getattr(config, "needs_means", False))
    schema: Callable[[Any, Any, int], RecordSchema | None] = lambda config, info, n_prompts: None
    prompt_records: Callable[[RunContext], list[dict[str, Any]] | None] = lambda ctx: None
    conditional_means: Callable[[Any], bool] = lambda config: getattr(config, "ablation", None) == "cama"
    base_correct_only: bool = True
    optional_identity: tuple[str, ...] = ()
    batch_size: Callable[[Any], int] = lambda config: int(getattr(config, "batch_size", 128))
    n_boot: Callable[[Any], int] = lambda config: int(getattr(config, "n_boot", 1000))


LABELS = ("model", "task", "source", "numbers", "format")
"""The caller's names of the model and the prompts (``meta``): the model's signature and fingerprint and the
prompts' hash already determine the results, so they are compared only when both identities hold them."""


def check_inputs(model: Any, tokens: Any, answers: Any) -> tuple[torch.Tensor, torch.Tensor]:
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

    def __enter__(self) -> "Run":
        if self.path.exists() and not self.path.is_dir():
            raise RunMismatchError(f"--out {self.path} exists and is not a directory; choose a directory")
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = DirLock(self.path).acquire()
        try:
            refuse_links(self.path)
            clean_temporaries(self.path)
            ident = self.path / IDENTITY_FILE
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
                    f"{self.path} holds af1 results but no {IDENTITY_FILE}: cannot tell which command wrote them; "
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


def execute(
    analysis: Analysis,
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
) -> Any:
    """Run ``analysis`` with ``config`` on ``tokens``/``answers`` (see the module docstring).

    ``out_dir``: the run directory (``None``: nothing is written, records are kept in memory).
    ``fit``: the :class:`~circuits.fitset.FitSet` the means are fitted on (the scored prompts are removed
    from it); ``cache``: a means cache to use instead (named by its hash in the identity), or, with ``fit``,
    the cache already fitted on it (several analyses of one prompt set share it). ``min_count``: fit
    prompts each mean needs (default: the fit set's, else :data:`~circuits.fitset.DEFAULT_MIN_COUNT`).
    ``meta``: the caller's description, copied into the identity (except ``command``, ``base_accuracy``
    and ``n_checked``, which describe a run rather than determine it) and the summary. ``prompts``:
    records aligned with ``tokens`` for ``prompts.jsonl``. ``held``: a :class:`Run` the caller already
    holds for ``out_dir`` (commands take the lock before loading the model). ``prepared``: the
    :class:`~circuits.prepared.Prepared` of ``tokens`` (:func:`circuits.prepared.prepare`): written to the run
    directory (or, reloaded from it, checked against the run identity), and, when reloaded, its record of which
    prompts the unmodified model answers correctly is used instead of checking them again. ``on_means``: called
    with the means cache the run uses (a caller running several analyses on one fit set fits it once).
    """
    keep = None
    if prepared is not None and prepared.keep is not None and torch.is_tensor(tokens) and \
            torch.equal(torch.as_tensor(tokens).cpu().long(), prepared.prompts.tokens.cpu().long()):
        keep = prepared.keep
    ctx, batch_size = scored_context(analysis, model, tokens, answers, config, meta=meta, prompts=prompts,
                                     progress=progress, keep=keep)
    needs_means = analysis.needs_means(config)
    if needs_means:
        plan_means(ctx, conditional=analysis.conditional_means(config), fit=fit, cache=cache, min_count=min_count)
    loading = dict(batch_size=batch_size, progress=progress)
    if out_dir is None:
        if needs_means:
            ctx.cache = load_means(model, ctx, cache, None, **loading)
            if on_means is not None:
                on_means(ctx.cache)
        return analysis.run(model, config, ctx)
    run = held if held is not None else Run(out_dir, analysis.name)
    with run if held is None else contextlib.nullcontext():
        check_current(run.path)
        results_name = analysis.results_file or files.NO_RESULTS
        run_dir = RunDir(run.path, analysis.identity(config, ctx, model), results_name=results_name,
                         optional=LABELS + analysis.optional_identity).open()
        if needs_means:
            ctx.cache = load_means(model, ctx, cache, run_dir, **loading)
            keep_means(run_dir, ctx.cache)
            if on_means is not None:
                on_means(ctx.cache)
        if prepared is not None:
            keep_prepared(run_dir, prepared, ctx.keep)
        if analysis.results_file is not None:
            ctx.store = DirStore(run_dir, analysis.schema(config, info_of(model), int(ctx.tokens.shape[0])))
        records = analysis.prompt_records(ctx)
        if records is not None:
            run_dir.write_jsonl(files.PROMPTS, records)
        result = analysis.run(model, config, ctx)
        analysis.write(result, run_dir, ctx)
        return result


def info_of(model: Any) -> Any:
    return iv.adapt(model).info


def scored_context(analysis: Analysis, model: Any, tokens: Any, answers: Any, config: Any, *,
                   meta: Mapping[str, Any] | None,
                   prompts: Sequence[Mapping[str, Any]] | None, progress: bool,
                   keep: torch.Tensor | None = None) -> tuple[RunContext, int]:
    """Validate ``config`` and the inputs, keep the prompts the unmodified model answers correctly (when the
    analysis scores only those; ``keep``: which they are, known from an earlier run of the same model on the
    same prompts) and return the :class:`RunContext` (without means yet) and the batch size."""
    analysis.validate(config, info_of(model))
    batch_size = check_positive("batch_size", analysis.batch_size(config))
    check_positive("n_boot", analysis.n_boot(config))
    tokens, answers = check_inputs(model, tokens, answers)
    if prompts is not None and len(prompts) != tokens.shape[0]:
        raise ValueError(f"prompts has {len(prompts)} records for {tokens.shape[0]} prompts")
    if analysis.base_correct_only and keep is not None and keep.shape == (tokens.shape[0],):
        keep = keep.bool().cpu()
    elif analysis.base_correct_only:
        keep = base_correct(model, tokens, answers, batch_size=batch_size)
    else:
        keep = torch.ones(tokens.shape[0], dtype=torch.bool)
    if not bool(keep.any()):
        raise PromptError(
            f"the unmodified model answers none of the {tokens.shape[0]} prompts correctly: nothing to "
            f"{analysis.name}; check that the answers are the model's answer token ids and that the prompts "
            f"start with BOS"
        )
    ctx = RunContext(
        tokens=tokens[keep], answers=answers[keep], n_given=int(tokens.shape[0]), keep=keep,
        given_tokens=tokens, given_answers=answers, cache=None, store=MemoryStore(), progress=progress,
        meta=dict(meta or {}), prompts=prompts, tokenizer=getattr(model, "tokenizer", None),
    )
    return ctx, batch_size
