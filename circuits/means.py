"""The means of a run: fitted on the fit set (never on the prompts it scores), kept in the run directory
and checked when a run resumes.

:func:`plan_means` decides the means before anything is written and enforces what :mod:`circuits.prompts.fitset`
promises (no scored prompt among the fit prompts, at least ``min_count`` fit prompts behind every mean a
scored prompt reads); :func:`load_means` then fits or reloads them. :func:`means_cache` loads the cache a run
wrote (bound to the fit set by the fit prompts' digests), else the one the user's results cache holds under
:func:`means_key` (:mod:`circuits.store.usercache`: fitted once for every command and the API, verified by hash
and by the fit prompts' digests on reuse), or fits a new one and keeps it there; :func:`keep_means` saves it;
:func:`check_current` refuses directories written when the means were fitted on the scored prompts themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int

import interventions as iv
from circuits.errors import CorruptRunError, FitSetError, RunMismatchError
from circuits.logs import get_logger
from circuits.prompts.fitset import DEFAULT_MIN_COUNT, FitSet
from circuits.store import files
from circuits.store.runs import RunDir, read_json_object
from circuits.timing import note_means
from circuits.validation import check_positive
from interventions.coverage import Coverage, entry_counts, row_digests
from interventions.types import JsonDict, JsonMapping, Model

if TYPE_CHECKING:  # pragma: no cover
    from circuits.analyses import RunContext

__all__ = ["OUTDATED_MEANS", "cached_means", "check_current", "fitted_on", "keep_means", "load_means", "means_cache",
           "means_key", "plan_means", "store_means"]


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
                progress: bool, key: JsonMapping | None = None, label: str | None = None) -> iv.MeanCache:
    """The means cache fitted on ``fit_tokens``, without writing anything to ``run_dir``: the one this run wrote to
    ``run_dir`` (checked against its recorded content hash and against the fit set it must have been
    fitted on), else the one an earlier command fitted under ``key`` (:func:`means_key`) in the user's cache
    (:mod:`circuits.store.usercache`, verified by hash; ``None``: not looked up), else a fresh
    :meth:`~interventions.MeanCache.fit`, then kept in the user's cache (``label``: the model's name there).
    :func:`keep_means` saves it in the run."""
    recorded = run_dir is not None and files.MEANS in run_dir.artifacts()
    path = run_dir.checked_artifact(files.MEANS) if run_dir is not None and recorded else None
    if path is not None:
        cache = iv.MeanCache.load(path)
        if not fitted_on(cache, fit_tokens):
            raise CorruptRunError(
                f"{path} was not fitted on this run's fit set ({len(fit_tokens)} prompts): results resumed with it "
                f"would mix two caches; move it away to recompute it, or use a new --out directory"
            )
        note_means(fitted=False)
        return cache
    cache = cached_means(key, fit_tokens) if key is not None else None
    note_means(fitted=cache is None)
    if cache is None:
        cache = iv.MeanCache.fit(model, fit_tokens, batch_size=batch_size, progress=progress)
        if key is not None:
            store_means(key, cache, label)
    target = run_dir.path / files.MEANS if run_dir is not None else None
    if target is not None and target.exists():
        raise CorruptRunError(
            f"{target} was not written by this run (no content hash recorded in {files.ARTIFACTS}): results "
            f"resumed with it could mix two caches; move it away to recompute it, or use a new --out directory"
        )
    return cache


def means_key(model: Model, fit: FitSet, spec: Any, means: str | None) -> JsonDict:
    """What fitted means are a function of, as the user's cache keys them: the package version, the model
    (shapes, fingerprint, SHA-256 of its weights, the device type), the fit tokens' SHA-256 and how they were
    drawn (fit spec, task), the task's or prompt dataset's hash and the prompt format (of ``spec``, the prompt
    spec, when the prompts came from one) and whether the means are conditional (CAMA) or plain."""
    from circuits import __version__
    from circuits.prompts.prepared import dataset_key, task_key

    ad = iv.adapt(model)
    try:
        device = ad.device().type
    except (AttributeError, RuntimeError, NotImplementedError):  # a remote model: no device here
        device = "remote"
    key: JsonDict = {"kind": "means", "version": __version__, "model": {**ad.model_identity(), "device": device},
                           "fit": fit.identity(), "conditional": means == "cama"}
    if spec is not None and getattr(spec, "format", None) is not None:
        key["task"] = (task_key(spec.task, spec.source) if spec.prompts is None
                       else {"prompts": dataset_key(spec.prompts)})
        key["format"] = spec.format.identity()
    return key


def cached_means(key: JsonMapping, fit_tokens: Int[torch.Tensor, "n_fit pos"]) -> iv.MeanCache | None:
    """The means the user's cache holds under ``key``, verified (the file's SHA-256, then the cache's own checks
    and its fit prompts' digests); ``None`` when it holds none or the entry is corrupt (removed, with a line)."""
    import tempfile

    from circuits.store import usercache

    data = usercache.get("means", key)
    if data is None:
        return None
    with tempfile.TemporaryDirectory(prefix="af1-means-") as tmp:
        path = Path(tmp) / files.MEANS
        path.write_bytes(data)
        try:
            cache = iv.MeanCache.load(path)
        except iv.InterventionError as err:
            cache = None
            reason = str(err)
        else:
            reason = "" if fitted_on(cache, fit_tokens) else "not fitted on this fit set"
    if cache is None or reason:
        get_logger("cache").warning("cached means %s... do not hold together (%s): fitting them again",
                                    usercache.key_sha256(key)[:12], reason)
        usercache.discard("means", key)
        return None
    cache.source = None
    get_logger("runner").info("means: reused from the cache %s (fitted on the same model and fit set by an "
                              "earlier command; af1 cache clear removes it)", usercache.results_root())
    return cache


def store_means(key: JsonMapping, cache: iv.MeanCache, label: str | None = None) -> None:
    """Keep ``cache`` in the user's cache under ``key`` (atomically; bounded in size); ``label``: the model's name
    in ``af1 cache list``."""
    import tempfile

    from circuits.store import usercache

    if usercache.limit_bytes() == 0:
        return
    with tempfile.TemporaryDirectory(prefix="af1-means-") as tmp:
        path = Path(tmp) / files.MEANS
        cache.save(path)
        data = path.read_bytes()
    cache.source = None
    fit = key.get("fit", {})
    about = f"means of {label or 'a model'} on {fit.get('task') or 'given prompts'} ({fit.get('n_fit')} fit " \
            f"prompts), {'conditional' if key.get('conditional') else 'plain'}"
    usercache.put("means", key, data, about)


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
               batch_size: int, progress: bool, means: str | None = None) -> iv.MeanCache:
    """The cache :func:`plan_means` decided on: the caller's (which, with a fit set, must be fitted on it),
    else the one this run wrote to ``run_dir``, the one the user's cache holds for this model and fit set, or a
    fresh fit on ``ctx.fit`` (:func:`means_cache`); checked against the model. ``means``: the analysis's means
    (``"cama"``: conditional; ``"mean"``, ``"head"``: plain), part of the user cache's key."""
    if ctx.fit is not None:
        if cache is None:
            key = means_key(model, ctx.fit, ctx.spec, means)
            cache = means_cache(model, ctx.fit.tokens, run_dir, batch_size=batch_size, progress=progress, key=key,
                                label=ctx.meta.get("model"))
        elif not fitted_on(cache, ctx.fit.tokens):
            raise FitSetError("the given MeanCache was not fitted on the given fit set (without the scored "
                              "prompts): pass one of them, or fit the cache on fit.tokens")
    assert cache is not None  # plan_means refused a run with neither
    cache.check_model(model)
    return cache
