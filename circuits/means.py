"""The means of a run: fitted on the fit set (never on the prompts it scores), kept in the run directory
and checked when a run resumes.

:func:`plan_means` decides the means before anything is written and enforces what :mod:`circuits.prompts.fitset`
promises (no scored prompt among the fit prompts, at least ``min_count`` fit prompts behind every mean a
scored prompt reads); :func:`load_means` then fits or reloads them. :func:`means_cache` loads the cache a run
wrote (bound to the fit set by the fit prompts' digests) or fits a new one; :func:`keep_means` saves it;
:func:`check_current` refuses directories written when the means were fitted on the scored prompts themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Int

import interventions as iv
from circuits.errors import CorruptRunError, FitSetError, RunMismatchError
from circuits.prompts.fitset import DEFAULT_MIN_COUNT, FitSet
from circuits.store import files
from circuits.store.runs import RunDir, read_json_object
from circuits.validation import check_positive
from interventions.coverage import Coverage, entry_counts, row_digests
from interventions.types import Model

if TYPE_CHECKING:  # pragma: no cover
    from circuits.analyses import RunContext

__all__ = ["OUTDATED_MEANS", "check_current", "fitted_on", "keep_means", "load_means", "means_cache", "plan_means"]


OUTDATED_MEANS = "fitted on the prompts"
"""The ``means`` of a search identity written before means came from a separate fit set."""


def check_current(path: Path) -> None:
    """Refuse a run directory written before the means were fitted on a fit set separate from the scored
    prompts (its CAMA means included each scored prompt's own activation): its results cannot be resumed."""
    ident = path / files.IDENTITY
    if not ident.exists():
        return
    try:
        theirs = read_json_object(ident)
    except CorruptRunError as err:
        raise RunMismatchError(str(err)) from None
    outdated = theirs.get("means") == OUTDATED_MEANS or (
        theirs.get("command") == "prune" and theirs.get("cache_sha256") and "means" not in theirs)
    if outdated:
        raise RunMismatchError(
            f"{path} was written by an earlier version that fitted the means on the scored prompts themselves "
            f"(each prompt contributed to the mean that replaced its own state): its results cannot be resumed "
            f"or mixed with means from a fit set; use a new --out directory, or delete {path} to start over"
        )


def means_cache(model: Model, fit_tokens: Int[torch.Tensor, "n_fit pos"], run_dir: RunDir | None, *, batch_size: int,
                progress: bool) -> iv.MeanCache:
    """The means cache fitted on ``fit_tokens``, without writing anything: the one this run wrote to
    ``run_dir`` (checked against its recorded content hash and against the fit set it must have been
    fitted on), else a fresh :meth:`~interventions.MeanCache.fit`. :func:`keep_means` saves it."""
    recorded = run_dir is not None and files.MEANS in run_dir.artifacts()
    path = run_dir.checked_artifact(files.MEANS) if run_dir is not None and recorded else None
    if path is not None:
        cache = iv.MeanCache.load(path)
        if not fitted_on(cache, fit_tokens):
            raise CorruptRunError(
                f"{path} was not fitted on this run's fit set ({len(fit_tokens)} prompts): results resumed with it "
                f"would mix two caches; move it away to recompute it, or use a new --out directory"
            )
        return cache
    cache = iv.MeanCache.fit(model, fit_tokens, batch_size=batch_size, progress=progress)
    target = run_dir.path / files.MEANS if run_dir is not None else None
    if target is not None and target.exists():
        raise CorruptRunError(
            f"{target} was not written by this run (no content hash recorded in {files.ARTIFACTS}): results "
            f"resumed with it could mix two caches; move it away to recompute it, or use a new --out directory"
        )
    return cache


def fitted_on(cache: iv.MeanCache, fit_tokens: Int[torch.Tensor, "n_fit pos"]) -> bool:
    """Whether ``cache`` was fitted on exactly the prompts ``fit_tokens`` (by their digests)."""
    return cache.fit_rows is not None and cache.n_prompts == len(fit_tokens) and torch.equal(
        cache.fit_rows, torch.unique(row_digests(fit_tokens)))


def keep_means(run_dir: RunDir, cache: iv.MeanCache) -> None:
    """Save ``cache`` as the run's means file (unless that file already holds it) and record its hash."""
    from circuits.store.atomic import no_link, write_with

    target = no_link(run_dir.path / files.MEANS)
    if not target.exists() or iv.MeanCache.load(target).sha256 != cache.sha256:
        write_with(target, cache.save)
        cache.source = str(target)
    run_dir.record_artifact(files.MEANS)


def plan_means(ctx: RunContext, *, conditional: bool, fit: FitSet | None, cache: iv.MeanCache | None,
               min_count: int | None) -> None:
    """Decide a run's means before anything is fitted or written, with what :mod:`circuits.prompts.fitset` promises
    enforced: the fit set without the scored prompts (or the caller's ``cache``, which must not hold a scored
    prompt), and every mean the scored prompts read (per ``(position, token)`` entry for CAMA,
    ``conditional``; else per position) backed by at least ``min_count`` fit prompts, counted from the fit
    tokens (or the cache's counts). Sets ``ctx.fit``, ``ctx.coverage`` and ``ctx.means_identity`` (what the
    run identity records)."""
    if fit is not None:
        fit = fit.without(ctx.tokens)
        minimum = fit.spec.min_count if min_count is None else int(min_count)
        counts = entry_counts(fit.tokens, ctx.tokens) if conditional else torch.full_like(ctx.tokens, len(fit))
        coverage = Coverage.of(counts, ctx.tokens, len(fit), minimum)
        ctx.means_identity = {"fit": fit.identity()}
    elif cache is not None:
        inside = cache.contains(ctx.tokens)
        if bool(inside.any()):
            row = int(inside.nonzero()[0, 0])
            raise FitSetError(
                f"{int(inside.sum())} scored prompt(s) are in the MeanCache's fit set (first: prompt {row}): each "
                f"would contribute to the mean that replaces its own state; fit the cache on a set without them"
            )
        minimum = DEFAULT_MIN_COUNT if min_count is None else int(min_count)
        coverage = cache.coverage(ctx.tokens, minimum, conditional=conditional)
        ctx.means_identity = {"cache_sha256": cache.sha256}
    else:
        raise FitSetError(
            "this analysis needs means (CAMA, plain-mean or mean head ablation) fitted on prompts other than the "
            "ones it scores: pass fit_tokens= (e.g. circuits.prompts.fitset.draw_fit_set(model, task, tokens).tokens) "
            "or cache= (a MeanCache fitted on a separate set)"
        )
    check_positive("min_count", minimum)
    if coverage.under:
        worst = "; ".join(e.describe(ctx.tokenizer) for e in coverage.under[:3])
        more = (f"raise the fit set's size (--fit-size, now {fit.spec.size})" if fit is not None and fit.task
                else "fit the means on more prompts of the task")
        raise FitSetError(
            f"{len(coverage.under)} of the {len(coverage.entries)} means the scored prompts read have fewer than "
            f"{minimum} fit prompts ({worst}): {more}, or lower the minimum explicitly (--fit-min-count, min_count=)"
        )
    ctx.fit, ctx.coverage = fit, coverage
    ctx.means_identity["min_count"] = minimum


def load_means(model: Model, ctx: RunContext, cache: iv.MeanCache | None, run_dir: RunDir | None, *,
               batch_size: int, progress: bool) -> iv.MeanCache:
    """The cache :func:`plan_means` decided on: the caller's (which, with a fit set, must be fitted on it),
    else the one this run wrote to ``run_dir`` or a fresh fit on ``ctx.fit`` (:func:`means_cache`); checked
    against the model."""
    if ctx.fit is not None:
        if cache is None:
            cache = means_cache(model, ctx.fit.tokens, run_dir, batch_size=batch_size, progress=progress)
        elif not fitted_on(cache, ctx.fit.tokens):
            raise FitSetError("the given MeanCache was not fitted on the given fit set (without the scored "
                              "prompts): pass one of them, or fit the cache on fit.tokens")
    assert cache is not None  # plan_means refused a run with neither
    cache.check_model(model)
    return cache
