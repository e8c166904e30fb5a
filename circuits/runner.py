"""One runner for every analysis: specs -> model -> prompts -> means -> analysis -> store -> summary -> report.

An analysis is pure (:class:`circuits.analyses.Analysis`): ``run(model, config, ctx)`` takes the model, a
frozen config and a :class:`RunContext` (the base-correct prompts, the means cache, a result store) and
returns a result; it opens no file. The runner does everything around it, the same way for every command, from
one entry point, :func:`run`::

    run(SEARCH, SearchConfig(grid="full"), ModelSpec("arith-gpt2"), PromptSpec("add_sub"), RunOptions(out="runs/a"))

``model`` is a :class:`ModelSource` (a :class:`~circuits.models.spec.ModelSpec` to load, or a
:class:`~circuits.models.spec.LoadedModel`), ``prompts`` a :class:`PromptSource` (a
:class:`~circuits.prompts.spec.PromptSpec` to prepare, or :class:`~circuits.prompts.ready.ReadyPrompts`); the
runner asks both the same way and tells neither kind from the other. Its steps:

1. hold the output directory (:class:`~circuits.destinations.Run`: its lock, a directory of another command refused
   at once);
2. load the model (``model.load``: a spec prints the memory estimate first) and get the prompts ready with the fit
   set the analysis's means need (``prompts.ready``: a spec is reloaded from the directory when an earlier run
   prepared it under the same key);
3. with the batch size (``"auto"``: sized to the device, halved on out-of-memory errors,
   :func:`circuits.models.memory.run_batched`):
   a. :func:`scored_context`: validate the config against the model (the config's ``validate``, the one check of
      its values) and the inputs (answers, BOS, padding); keep the prompts the unmodified model answers correctly
      (once; a rerun reloads which they are with the prepared prompts, :mod:`circuits.prompts.prepared`);
   b. :func:`circuits.means.plan_means`, when the analysis needs means: the fit set without the scored prompts,
      every mean a scored prompt reads backed by ``min_count`` fit prompts;
   c. the destination (:func:`circuits.destinations.destination`): with an output directory, refuse one of an
      earlier version's means, build the run identity (:attr:`Analysis.identity`, which records the fit set) and
      check or write ``run.json``; without, nothing is written;
   d. the means (:func:`circuits.means.load_means`: the cache this run wrote is reloaded, checked by content hash
      and fit-set digests, instead of refitted; else the one the user's results cache holds for this model and fit
      set, :mod:`circuits.store.usercache`; else fitted and kept there), then the prepared prompts (kept in the
      results cache too, with the check of which prompts the model answers) and the store: resumed records
      validated against the analysis's schema, appends crash-safe and fsynced;
   e. run the analysis, then write its outputs (:attr:`Analysis.write`: summary and report).

Each step is timed into the :class:`circuits.timing.Timings` of the command running it (load, prompts, fit or
cached, analysis, report): the command's last line; a run of the Python API logs its own line.

:func:`execute` (from tensors) and :func:`run_analysis` (from specs or loaded values) are the earlier entry points,
kept as thin wrappers of :func:`run`. File names live in :mod:`circuits.store.files`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from jaxtyping import Bool, Int

import interventions as iv
from circuits import timing
from circuits.analyses import Analysis, C, MemoryStore, R, RunContext
from circuits.destinations import LABELS, Directory, Memory, Run, command_of, destination, hold
from circuits.errors import ArgumentError, PromptError
from circuits.faithfulness import base_correct
from circuits.logs import get_logger
from circuits.means import load_means, plan_means
from circuits.models import memory
from circuits.models.spec import LoadedModel, ModelSpec
from circuits.options import RunOptions
from circuits.prompts.fitset import FitSet
from circuits.prompts.prepared import Prepared, remember
from circuits.prompts.ready import ReadyPrompts
from circuits.prompts.spec import PromptSpec
from interventions.adapter import ModelInfo
from interventions.types import JsonDict, JsonMapping, Model
from interventions.validation import check_answers, check_layout, check_tokens, special_token_ids

if TYPE_CHECKING:
    from circuits.prompts.sampling import Prompts

__all__ = ["LABELS", "Directory", "Memory", "ModelSource", "PromptSource", "Run", "RunOptions", "check_inputs",
           "command_of", "destination", "execute", "hold", "run", "run_analysis", "scored_context"]


class ModelSource(Protocol):
    """Where the runner gets its model: a :class:`~circuits.models.spec.ModelSpec` (loaded after the memory
    estimate) or a :class:`~circuits.models.spec.LoadedModel`. ``label``: its name in the run's description;
    ``dtype``: its weights' dtype name (``None``: float32, or as loaded)."""

    @property
    def label(self) -> str | None: ...

    @property
    def dtype(self) -> str | None: ...

    def load(self, *, estimate: PromptSpec | None = None, batch_size: int = 128, means: bool = True) -> Model: ...


class PromptSource(Protocol):
    """Where the runner gets its prompts: a :class:`~circuits.prompts.spec.PromptSpec` (prepared with the fit set of
    ``means``, or reloaded from ``out``) or :class:`~circuits.prompts.ready.ReadyPrompts` (as they are). ``spec``:
    the prompt spec they come from (a spec is its own), which a model spec's memory estimate counts."""

    @property
    def spec(self) -> PromptSpec | None:
        """The prompt spec the prompts come from (what a memory estimate counts), or ``None``."""

    def ready(self, model: Model, *, name: str | None, means: str | None, out: str | Path | None, progress: bool,
              batch_size: int) -> ReadyPrompts: ...


def run(analysis: Analysis[C, R], config: C, model: ModelSource, prompts: PromptSource,
        options: RunOptions = RunOptions()) -> R:
    """Run ``analysis`` with ``config`` on ``model`` and ``prompts`` (the steps: see the module docstring); returns
    the analysis's result."""
    requested = config.batch_size if options.batch_size is None else options.batch_size
    first = memory.AUTO_CPU_BATCH if requested == "auto" else int(requested)  # auto: sized once the model is loaded
    means = analysis.means(config)
    outer = timing.current()
    with contextlib.ExitStack() as stack:
        times = outer if outer is not None else stack.enter_context(timing.command())
        if outer is None:
            times.whole = "whole run"
        times.runs += 1
        with hold(options.out, analysis.name, options.held) as held:
            with times.phase("load"):
                loaded = model.load(estimate=prompts.spec, batch_size=first, means=means is not None)
            with times.phase("prompts"):
                ready = prompts.ready(loaded, name=model.label, means=means, out=options.out,
                                      progress=options.progress, batch_size=first)
            meta: JsonDict = {**({"model": model.label} if model.label is not None else {}), **ready.meta,
                                    **({"command": list(options.command)} if options.command is not None else {})}
            def attempt(size: int) -> R:
                sized = replace(config, batch_size=size)  # type: ignore[type-var]
                return evaluate(analysis, loaded, ready, sized, meta, options, held, times)

            result = memory.run_batched(requested, loaded, ready.tokens, model.dtype, attempt)
        if outer is None:
            get_logger("runner").info(times.line())
    usage = getattr(loaded, "usage", None)
    if getattr(loaded, "remote", False) and usage is not None:
        get_logger("runner").info("remote usage of this run (prompt preparation included): %s requests, %s prompt "
                                  "tokens", usage.requests, f"{usage.tokens:,}")
    return result


def evaluate(analysis: Analysis[C, R], model: Model, prompts: ReadyPrompts, config: C,
             meta: JsonMapping, options: RunOptions, held: Run | None,
             times: timing.Timings | None = None) -> R:
    """Step 3 of :func:`run` with one batch size: the scored prompts, the means, the destination, the store, the
    analysis and its outputs (timed into ``times``: prompts, fit, analysis, report)."""
    times = times if times is not None else timing.Timings()
    with times.phase("prompts"):
        ctx = scored_context(analysis, model, prompts.tokens, prompts.answers, config, meta=meta,
                             prompts=prompts.records, progress=options.progress,
                             keep=known_keep(prompts.prepared, prompts.tokens))
        ctx.spec = prompts.spec
        means = analysis.means(config)  # "cama": conditional, "mean"/"head": plain, None: no means
        needs_means = means is not None
        if needs_means:
            plan_means(ctx, conditional=means == "cama", fit=prompts.fit, cache=options.cache,
                       min_count=options.min_count)
    with destination(options.out, analysis.name, held) as dest:
        with times.phase("analysis"):
            dest.open(analysis, lambda: analysis.identity(config, ctx, model))
        if needs_means:
            with times.phase("fit"):
                if options.cache is not None:
                    timing.note_means(fitted=False)
                ctx.cache = load_means(model, ctx, options.cache, dest.run_dir, batch_size=config.batch_size,
                                       progress=options.progress, means=means)
                dest.keep_means(ctx.cache)
            if options.on_means is not None:
                options.on_means(ctx.cache)
        with times.phase("analysis"):
            if prompts.prepared is not None:
                dest.keep_prepared(prompts.prepared, ctx.keep)
                if analysis.base_correct_only:  # the check of which prompts the model answers, for the next command
                    remember(prompts.prepared, ctx.keep, ctx.meta.get("model"))
            ctx.store = dest.store(lambda: analysis.schema(config, info_of(model), int(ctx.tokens.shape[0])))
            ctx.checkpoints = dest.checkpoints()
            dest.write_prompts(analysis.prompt_records(ctx))
            result = analysis.run(model, config, ctx)
        with times.phase("report"):
            dest.write(analysis, result, ctx)
        return result


def check_inputs(model: Model, tokens: object,
                 answers: object) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, " batch *k"]]:
    """Tokens and answers checked as the analyses need them: a ``[batch, pos]`` id tensor of one layout
    with BOS at position 0 and no padding, and one answer token id per prompt."""
    info = iv.adapt(model).info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = check_answers(answers, int(tokens.shape[0]), info.d_vocab)
    bos_id, pad_id = special_token_ids(model)
    check_layout(tokens, bos_id=bos_id, pad_id=pad_id)
    return tokens, answers


def info_of(model: Model) -> ModelInfo:
    return iv.adapt(model).info


def known_keep(prepared: Prepared | None, tokens: object) -> Bool[torch.Tensor, " n"] | None:
    """Which of ``tokens`` the unmodified model answers correctly, as the reloaded prepared prompts recorded it
    (``None``: not known, or ``tokens`` are not those prompts)."""
    if prepared is None or prepared.keep is None or not torch.is_tensor(tokens):
        return None
    return prepared.keep if torch.equal(tokens.cpu().long(), prepared.prompts.tokens.cpu().long()) else None


def scored_context(analysis: Analysis[C, R], model: Model, tokens: object, answers: object, config: C, *,
                   meta: JsonMapping | None,
                   prompts: Sequence[JsonMapping] | None, progress: bool,
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


# --- the earlier entry points ---------------------------------------------------------------------------------
def execute(
    analysis: Analysis[C, R],
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    answers: Int[torch.Tensor, " batch *k"],
    config: C,
    *,
    out_dir: str | Path | None = None,
    cache: iv.MeanCache | None = None,
    fit: FitSet | None = None,
    min_count: int | None = None,
    meta: JsonMapping | None = None,
    prompts: Sequence[JsonMapping] | None = None,
    progress: bool = True,
    held: Run | None = None,
    prepared: Prepared | None = None,
    on_means: Callable[[iv.MeanCache], None] | None = None,
    spec: PromptSpec | None = None,
) -> R:
    """:func:`run` of ``analysis`` on a loaded ``model`` and the caller's ``tokens``/``answers`` (the Python API's
    entry point): ``fit`` (the :class:`~circuits.prompts.fitset.FitSet` the means are fitted on), ``prompts``
    (records aligned with ``tokens`` for ``prompts.jsonl``), ``meta`` (the caller's description, copied into the
    identity except ``command``, ``base_accuracy`` and ``n_checked``, and into the summary), ``prepared`` and
    ``spec`` (the prepared prompts and the prompt spec they came from) make the
    :class:`~circuits.prompts.ready.ReadyPrompts`; ``out_dir``, ``cache``, ``min_count``, ``progress``, ``held`` and
    ``on_means`` are the :class:`RunOptions`. The batch size is the config's."""
    given = dict(meta or {})
    ready = ReadyPrompts(tokens=tokens, answers=answers, fit=fit, records=prompts, meta=given, spec=spec,
                         prepared=prepared)
    return run(analysis, config, LoadedModel(model, name=given.get("model")), ready,
               RunOptions(out=out_dir, progress=progress, cache=cache, min_count=min_count, on_means=on_means,
                          held=held))


def run_analysis(analysis: Analysis[C, R], model: Model | ModelSpec, prompts: PromptSpec | Prompts, config: C, *,
                 out: str | Path | None = None, batch_size: int | str | None = None, progress: bool = True,
                 command: Sequence[str] | None = None, name: str | None = None, spec: PromptSpec | None = None,
                 cache: iv.MeanCache | None = None, on_means: Callable[[iv.MeanCache], None] | None = None,
                 held: Run | None = None) -> R:
    """:func:`run` with the earlier signature: ``model`` a :class:`~circuits.models.spec.ModelSpec` or a loaded model
    (named ``name``), ``prompts`` a :class:`~circuits.prompts.spec.PromptSpec` or prepared
    :class:`~circuits.prompts.Prompts` (of the prompt spec ``spec``); the keywords are the :class:`RunOptions`."""
    from circuits.prompts.sampling import Prompts

    source: ModelSource = model if isinstance(model, ModelSpec) else LoadedModel(model, name=name)
    given: PromptSource = ReadyPrompts.of(prompts, spec) if isinstance(prompts, Prompts) else prompts
    return run(analysis, config, source, given, RunOptions(out=out, batch_size=batch_size, progress=progress,
                                                           command=command, cache=cache, on_means=on_means,
                                                           held=held))
