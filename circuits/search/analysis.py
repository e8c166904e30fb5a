"""The AF1 search over ``(wait, transfer)``: evaluation order, resumable results and outputs."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.analyses import Analysis, RunContext, configured
from circuits.faithfulness import answer_width, summarize
from circuits.logs import get_logger
from circuits.models.spec import LoadedModel
from circuits.prompts.fitset import FitSet, FitSpec, fit_set_of
from circuits.prompts.ready import ReadyPrompts
from circuits.runner import RunOptions, run
from circuits.search.config import SearchConfig
from circuits.search.evaluators import make_evaluator
from circuits.search.results import ConfigResult, SearchResult, config_row
from circuits.search.rule import Config, configurations, scan, select, smallest_transfers
from circuits.search.schema import search_identity, search_schema
from circuits.store import files
from circuits.store.outcomes import PromptOutcomes
from circuits.store.runs import RunDir, dist_version
from circuits.vocab import Ablation, Grid, Means, SearchMethod, means_kind
from interventions.types import JsonDict, JsonMapping, Model, Tokens

"""Keys of ``meta`` that describe a run rather than determine its results."""


def search_af1(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    *,
    config: SearchConfig | None = None,
    cache: iv.MeanCache | None = None,
    fit_tokens: Tokens | None = None,
    min_count: int | None = None,
    fit: FitSet | FitSpec | None = None,
    threshold: float | None = None,
    grid: Grid | None = None,
    ablation: Ablation | None = None,
    out_dir: str | Path | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    method: SearchMethod | None = None,
    n_boot: int | None = None,
    configs_per_pass: int | None = None,
    meta: JsonMapping | None = None,
    prompts: Sequence[JsonMapping] | None = None,
) -> SearchResult:
    """Search the AF1 configurations of ``model`` on ``tokens`` and apply the selection rule.

    The search's settings are ``config`` (a :class:`SearchConfig`; default ``SearchConfig()``); its fields can
    also be given as keywords (``threshold=``, ``grid=``, ``ablation=``, ``method=``, ``seed=``, ``batch_size=``,
    ``n_boot=``, ``configs_per_pass=``), which override those of ``config``.

    Args:
        model: a TransformerLens model (eval mode).
        tokens: ``[batch, pos]`` token ids of one layout, BOS at position 0. Prompts the unmodified
            model gets wrong are dropped first (``base_accuracy`` in the result says how many were kept).
        answers: ``[batch]`` answer token ids.
        cache: a :class:`interventions.MeanCache` for CAMA / mean ablation fitted on prompts other than
            ``tokens`` (a scored prompt inside its fit set is refused).
        fit_tokens: ``[n_fit, pos]`` prompts of the same layout to fit the means on instead (the scored
            prompts are removed from them; e.g. ``circuits.prompts.fitset.draw_fit_set(model, task, tokens).tokens``);
            the cache is reloaded from ``out_dir/means.safetensors`` on resume. ``fit``: a
            :class:`~circuits.prompts.fitset.FitSet` (records how it was drawn) instead of ``fit_tokens``, or a
            :class:`~circuits.prompts.fitset.FitSpec`, drawn for the task ``meta["task"]``.
        min_count: fit prompts each mean the scored prompts read needs (default
            :data:`circuits.prompts.fitset.DEFAULT_MIN_COUNT`); fewer raise :class:`~circuits.errors.FitSetError`.
        threshold: faithfulness (fraction in [0, 1]) a configuration needs to be sufficient (default 0.9).
        grid: ``"full"`` evaluates every configuration; ``"auto"`` (default) only what the selection needs.
        ablation: ``"cama"`` (default), ``"mean"`` or ``"zero"`` at ``blocks.{wait}.hook_resid_post``.
        out_dir: if given, results are appended to ``out_dir/results.jsonl`` as they are known, and
            ``prompts.jsonl``, ``means.safetensors``, ``summary.json`` and ``report.html`` are written.
            Re-running into the same directory resumes; a different command raises ``RunMismatchError``.
        seed: seed of the bootstrap confidence intervals (recorded in the run identity; default 0).
        batch_size: prompts per forward pass (default 128). ``progress``: show tqdm bars.
        method: ``"fast"`` (default, exact shortcuts) or ``"naive"`` (one full forward pass per configuration); on a
            backend that skips no blocks but runs several configurations per pass (nnsight) both evaluate
            ``configs_per_pass`` configurations per forward pass (see
            :func:`~circuits.search.evaluators.make_evaluator`).
        configs_per_pass: configurations of one wait evaluated in one forward pass where the backend allows
            it (a remote search needs about ``1 / configs_per_pass`` as many requests; default 8).
        n_boot: bootstrap resamples per confidence interval (default 1000).
        meta: identity of the command (e.g. ``model``, ``task``, ``source``, ``command``); recorded in
            ``run.json`` / ``summary.json``. ``base_accuracy``/``n_checked`` there override the values
            measured on ``tokens`` (the caller filtered earlier). ``command`` is not part of the identity.
        prompts: ``{"prompt", "answer"}`` records aligned with ``tokens`` for ``prompts.jsonl``
            (default: token ids and answer token ids).
    """
    config = configured(SearchConfig, config, threshold=threshold, grid=grid, ablation=ablation, method=method,
                        seed=seed, batch_size=batch_size, n_boot=n_boot, configs_per_pass=configs_per_pass)
    ready = ReadyPrompts(tokens, answers, fit=fit_set_of(fit, fit_tokens, min_count, model=model, tokens=tokens,
                                                         meta=meta), records=prompts, meta=dict(meta or {}))
    result = run(SEARCH, config, LoadedModel(model, name=(meta or {}).get("model")), ready,
                 RunOptions(out=out_dir, progress=progress, cache=cache, min_count=min_count))
    result.out_dir = Path(out_dir) if out_dir is not None else None
    return result


def run_search(model: Model, config: SearchConfig, ctx: RunContext) -> SearchResult:
    """The search itself (pure): evaluate what ``config.grid`` needs on ``ctx``'s base-correct prompts,
    skipping configurations already in ``ctx.store`` and appending each new one to it, then apply the
    selection rule."""
    t0 = time.perf_counter()
    n_layers = iv.adapt(model).info.n_layers
    known: dict[Config, ConfigResult] = {}
    for rec in ctx.store.records():
        r = ConfigResult.from_dict(rec)
        known[r.config] = r
    evaluator = make_evaluator(model, ctx.tokens, ctx.answers, ctx.cache, ablation=config.ablation,
                               batch_size=config.batch_size, method=config.method,
                               configs_per_pass=config.configs_per_pass)
    counts = {"evaluated": 0, "resumed": 0}
    if getattr(model, "remote", False):  # a model on NDIF: what the search will cost in requests
        from circuits.search.cost import search_cost

        n_prompts, n_pos = (int(v) for v in ctx.given_tokens.shape[:2])
        get_logger("search").info("remote cost: " + search_cost(
            n_layers, n_prompts, n_pos, batch_size=config.batch_size, configs_per_pass=config.configs_per_pass,
            n_fit=len(ctx.fit) if ctx.fit is not None else 0).line())

    def evaluate(w: int, t: int) -> ConfigResult:
        if (w, t) in known:
            counts["resumed"] += 1
            return known[(w, t)]
        per = evaluator.evaluate(w, t)
        res = summarize(*per, n_boot=config.n_boot, seed=config.seed)
        r = ConfigResult.from_faithfulness(w, t, res, config.ablation, outcomes=PromptOutcomes.from_metrics(*per))
        counts["evaluated"] += 1
        ctx.store.append(r.to_dict())
        return r

    bar = tqdm(total=len(configurations(n_layers)), desc=f"AF1 search ({config.grid} grid)", unit="config",
               disable=not ctx.progress)
    try:
        results = scan(n_layers, config.threshold, config.grid, evaluate, bar=bar)
    finally:
        bar.close()
    # Results resumed from an earlier (e.g. full-grid) run count too: they can only add information.
    for c, r in known.items():
        results.setdefault(c, r)
    faith = {c: r.faithfulness for c, r in results.items()}
    chosen = select(faith, config.threshold)
    selected = results[chosen] if chosen is not None else None
    specs: list[JsonDict] = []
    if selected is not None:
        specs = [x.to_dict() for x in iv.af1_subgraph(n_layers, selected.wait, selected.transfer, ctx.cache,
                                                      config.ablation, n_last=answer_width(ctx.answers))]
    return SearchResult(
        n_layers=n_layers,
        threshold=float(config.threshold),
        ablation=config.ablation,
        grid=config.grid,
        method=config.method,
        results=sorted(results.values(), key=lambda r: (-r.wait, r.transfer)),
        selected=selected,
        smallest_transfer=smallest_transfers(faith, n_layers, config.threshold),
        n_evaluated=counts["evaluated"],
        n_resumed=counts["resumed"],
        passes=evaluator.passes,
        seconds=time.perf_counter() - t0,
        base_accuracy=float(ctx.meta.get("base_accuracy", ctx.keep.float().mean().item())),
        n_prompts=int(ctx.tokens.shape[0]),
        interventions=specs,
        prompts=scored_texts(ctx),
    )


def scored_texts(ctx: RunContext) -> list[str]:
    """The text of the scored prompts, as ``prompts.jsonl`` records them."""
    return [str(r["prompt"]) for r in search_prompt_records(ctx)]


def search_prompt_records(ctx: RunContext) -> list[JsonDict]:
    """``prompts.jsonl``: the caller's records of the kept prompts, or their token ids and answer ids."""
    kept = ctx.kept_prompts
    if kept is not None:
        return kept
    return [{"prompt": " ".join(map(str, row)), "answer": a}
            for row, a in zip(ctx.tokens.tolist(), ctx.answers.tolist())]


def write_search_outputs(result: SearchResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``summary.json`` and ``report.html`` of a finished search (the runner's ``write`` step)."""
    meta = {k: v for k, v in ctx.meta.items() if k not in ("base_accuracy", "n_checked")}
    write_outputs(result, run_dir.path, meta=meta, seed=int(run_dir.identity.get("seed", 0)),
                  n_checked=int(ctx.meta.get("n_checked", ctx.n_given)), identity=run_dir.identity,
                  means=ctx.means_summary(), notes=[n for n in [ctx.means_note()] if n])


def search_means(config: SearchConfig) -> Means | None:
    """The means a search needs: those of its ablation (:func:`circuits.vocab.means_kind`)."""
    return means_kind(config.ablation)


def search_row(result: SearchResult) -> JsonDict:
    """A sweep row of a search: the selected configuration (or, when none reaches the threshold, the most
    faithful one, with ``selected`` false) and the best faithfulness per wait."""
    best: dict[str, float] = {}
    for r in result.results:
        best[str(r.wait)] = max(best.get(str(r.wait), 0.0), r.faithfulness)
    pick = result.selected or max(result.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer))
    return {**config_row(pick), "selected": result.selected is not None,
            "faith_by_wait": dict(sorted(best.items(), key=lambda kv: -int(kv[0])))}


SEARCH: Analysis[SearchConfig, SearchResult] = Analysis(
    name="search",
    config_type=SearchConfig,
    results_file=files.SEARCH_RESULTS,
    identity=search_identity,
    schema=search_schema,
    run=run_search,
    write=write_search_outputs,
    means=search_means,
    prompt_records=search_prompt_records,
    summary_row=search_row,
    optional_identity=("threshold",),
)
"""The AF1 search as the runner runs it."""


def write_outputs(
    result: SearchResult,
    out_dir: str | Path,
    *,
    meta: JsonMapping,
    seed: int,
    n_checked: int,
    identity: JsonMapping,
    means: JsonMapping | None = None,
    notes: Sequence[str] = (),
) -> None:
    """``summary.json`` and ``report.html`` of a finished search in ``out_dir``; ``means``: the fit set and
    its counts (:meth:`~circuits.runner.RunContext.means_summary`), ``notes``: extra report lines."""
    import transformer_lens

    import circuits
    from circuits import report
    from circuits.store.runs import write_json
    from circuits.tasks.formats import describe_prompts

    out_dir = Path(out_dir)
    sel = result.selected
    summary = {
        "model": meta.get("model"),
        "task": meta.get("task"),
        "seed": int(seed),
        "threshold": result.threshold,
        "base_accuracy": result.base_accuracy,
        "n_checked": n_checked,
        "n_prompts": result.n_prompts,
        "selected": None
        if sel is None
        else {"wait": sel.wait, "transfer": sel.transfer, "faithfulness": sel.faithfulness,
              "ci_low": sel.ci_low, "ci_high": sel.ci_high, "n": sel.n},
        "selected_message": result.summary_line(),
        "interventions": result.interventions,
        "seconds": result.seconds,
        "circuits_version": circuits.__version__,
        "transformer_lens_version": getattr(transformer_lens, "__version__", None) or dist_version("transformer-lens"),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "smallest_transfer_per_wait": {str(w): t for w, t in sorted(result.smallest_transfer.items())},
        "grid": result.grid,
        "method": result.method,
        "ablation": result.ablation,
        "n_layers": result.n_layers,
        "n_configs_total": len(configurations(result.n_layers)),
        "n_configs_evaluated": len(result.results),
        "n_evaluated_this_run": result.n_evaluated,
        "n_resumed": result.n_resumed,
        "passes": result.passes,
        "command": list(meta.get("command") or sys.argv),
        "identity": dict(identity),
        "source": meta.get("source"),
        "prompt_format": describe_prompts(meta),
        "means": files.MEANS if (out_dir / files.MEANS).exists() else None,
        "fit": means,
    }
    write_json(out_dir / files.SUMMARY, summary)
    title = f"AF1 search: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'} ({result.ablation})"
    notes = [f"Prompts: {summary['prompt_format']}.", *notes]
    report.search_report(result, out_dir / files.REPORT, title=title, notes=notes)


def load_summary(out_dir: str | Path) -> JsonDict:
    """``summary.json`` of a finished search directory."""
    import json

    path = Path(out_dir) / files.SUMMARY
    if not path.exists():
        raise FileNotFoundError(f"no summary.json in {out_dir}: the search has not finished there")
    return json.loads(path.read_text())
