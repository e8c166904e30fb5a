"""The greedy pruning loop (pure) and its place in the runner (identity, schema, outputs)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.analyses import Analysis, RunContext, configured
from circuits.errors import ArgumentError, CorruptRunError
from circuits.faithfulness import FaithfulnessResult, answer_logits, answer_width, last_token_metrics, summarize
from circuits.models.spec import LoadedModel
from circuits.prompts.fitset import FitSet, FitSpec, fit_set_of
from circuits.prompts.ready import ReadyPrompts
from circuits.prune.attribution import head_attribution
from circuits.prune.config import NOT_IDENTITY, PruneConfig
from circuits.prune.heads import candidate_logits, head_attention, key_labels, pruned_subgraph, transfer_heads
from circuits.prune.result import CurvePoint, PruneResult, area_under_curve, summary_dict
from circuits.runner import RunOptions, run
from circuits.store import files
from circuits.store.records import Field, RecordSchema, faithfulness_fields
from circuits.store.runs import RunDir, tokens_sha256
from circuits.vocab import Ablation, HeadMethod, Means, Rank, means_kind
from interventions.registry import adapt
from interventions.types import Head, JsonDict, JsonMapping, Model, Tokens

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo


def criterion(head: Head, faith: float, diff: float) -> tuple:
    """Sort key: the smallest key hurts least (highest faithfulness, then logit diff, then head)."""
    return (-faith, -diff, head)


def prune_heads(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    *,
    config: PruneConfig | None = None,
    wait: int | None = None,
    transfer: int | None = None,
    cache: iv.MeanCache | None = None,
    fit_tokens: Tokens | None = None,
    min_count: int | None = None,
    fit: FitSet | FitSpec | None = None,
    ablation: Ablation | None = None,
    method: HeadMethod | None = None,
    target: float | None = None,
    rank: Rank | None = None,
    confirm_top: int | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    batch_size: int | None = None,
    n_boot: int | None = None,
    seed: int | None = None,
    meta: JsonMapping | None = None,
    prompts: Sequence[JsonMapping] | None = None,
) -> PruneResult:
    """Greedily remove the transfer heads of the AF1 subgraph ``(wait, transfer)``; see the module
    docstring for the criterion, the cost and the files written to ``out_dir``.

    ``tokens``: ``[batch, pos]`` prompts of one layout (BOS at 0); ``answers``: answer token ids.
    Prompts the unmodified model gets wrong are dropped first (``n_dropped``). The means for
    ``ablation="cama"|"mean"`` and ``method="mean"`` (per-position means of ``hook_z``) come from ``cache``,
    ``fit_tokens`` or ``fit`` (a ``FitSet``, or a ``FitSpec`` drawn for ``meta["task"]``), never from the scored
    prompts (as in :func:`circuits.search.search_af1`).
    ``meta`` (e.g. ``model``, ``task``, ``source``) is part of the run's identity (except the keys
    ``command``, ``base_accuracy`` and ``n_checked``, which describe it) and is copied into
    ``summary.json``. ``prompts``: records aligned with ``tokens`` (e.g. ``{"prompt", "answer"}``)
    extended with the token ids and written to ``prompts.jsonl`` for the base-correct prompts.

    The settings are ``config`` (a :class:`PruneConfig`), or its fields as keywords (``wait`` and ``transfer``
    are then required; ``ablation`` default ``"cama"``, ``method`` ``"zero"``, ``target`` 0.9, ``rank``
    ``"attribution"``, ``confirm_top`` all, ``batch_size`` 128, ``n_boot`` 1000, ``seed`` 0), which override
    those of ``config``.
    """
    if config is None and (wait is None or transfer is None):
        raise ArgumentError("prune_heads needs the subgraph: wait= and transfer= (or config=PruneConfig(...))")
    cfg = configured(PruneConfig, config, wait=wait, transfer=transfer, ablation=ablation, method=method,
                     target=None if target is None else float(target), rank=rank, confirm_top=confirm_top,
                     batch_size=batch_size, n_boot=n_boot, seed=seed)
    ready = ReadyPrompts(tokens, answers, fit=fit_set_of(fit, fit_tokens, min_count, model=model, tokens=tokens,
                                                         meta=meta), records=prompts, meta=dict(meta or {}))
    return run(PRUNE, cfg, LoadedModel(model, name=(meta or {}).get("model")), ready,
               RunOptions(out=out_dir, progress=progress, cache=cache, min_count=min_count))


def run_prune(model: Model, cfg: PruneConfig, ctx: RunContext) -> PruneResult:
    """The greedy loop itself (pure): replay the steps in ``ctx.store``, then remove one head per step
    until none is left, appending each step to the store."""
    t_start = time.perf_counter()
    info = adapt(model).info
    cache, tok, ans, batch_size = ctx.cache, ctx.tokens, ctx.answers, cfg.batch_size
    n_boot, seed, rank, method, confirm_top = cfg.n_boot, cfg.seed, cfg.rank, cfg.method, cfg.confirm_top
    base = iv.af1_subgraph(info.n_layers, cfg.wait, cfg.transfer, cache, cfg.ablation, n_last=answer_width(ans))
    all_heads = transfer_heads(info.n_layers, info.n_heads, cfg.wait, cfg.transfer)
    n_total = len(all_heads)
    n_dropped = ctx.n_given - int(tok.shape[0])
    curve = [check_row(CurvePoint.from_dict(r), i, all_heads) for i, r in enumerate(ctx.store.records())]
    removed: list[Head] = [p.removed for p in curve[1:] if p.removed is not None]
    passes_run = 0

    def evaluate(heads_removed: Sequence[Head]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ivs = pruned_subgraph(base, heads_removed, method, cache)
        return last_token_metrics(answer_logits(model, tok, ans, ivs, batch_size=batch_size), ans)

    def record(point: CurvePoint) -> None:
        curve.append(point)
        ctx.store.append(point.to_dict())

    def point_from(step: int, head: Head | None, kept: list[Head], res: FaithfulnessResult, **kw: Any) -> CurvePoint:
        return CurvePoint(
            step=step, removed=head, heads_kept=kept, n_heads_kept=len(kept), faithfulness=res.faithfulness,
            ci_low=res.ci_low, ci_high=res.ci_high, n=res.n, mean_answer_prob=res.mean_answer_prob,
            mean_logit_diff=res.mean_logit_diff, **kw,
        )

    bar = tqdm(total=n_total + 1, initial=len(curve), desc="prune heads", unit="step", disable=not ctx.progress)
    try:
        if not curve:
            t0 = time.perf_counter()
            res = summarize(*evaluate([]), n_boot=n_boot, seed=seed)
            passes_run += 1
            record(point_from(0, None, list(all_heads), res, passes=1, attribution_passes=0,
                              seconds=time.perf_counter() - t0))
            bar.update(1)
        while len(removed) < n_total:
            t0 = time.perf_counter()
            remaining = [h for h in all_heads if h not in removed]
            estimates: dict[Head, float] = {}
            n_attr = 0
            if rank == "attribution":
                estimates = head_attribution(
                    model, tok, ans, remaining, pruned_subgraph(base, removed, method, cache),
                    method=method, cache=cache, batch_size=batch_size,
                )
                n_attr = 1
                order = sorted(remaining, key=lambda h: (-estimates[h], h))
            else:
                order = list(remaining)
            confirm = order if confirm_top is None else order[:confirm_top]
            # the candidates' ablations share forward passes (rows of one pass, each block its own heads)
            logits = candidate_logits(model, tok, answer_width(ans), base, removed, confirm, method, cache,
                                      batch_size=batch_size)
            metrics = {head: last_token_metrics(logits[head], ans) for head in confirm}
            passes_run += len(confirm)
            scores = {h: (float(m[0].float().mean()), float(m[2].float().mean())) for h, m in metrics.items()}
            best = min(confirm, key=lambda h: criterion(h, *scores[h]))
            removed.append(best)
            res = summarize(*metrics[best], n_boot=n_boot, seed=seed)
            candidates = [
                {
                    "head": list(h),
                    "estimate": estimates.get(h),
                    "faithfulness": scores[h][0] if h in scores else None,
                    "mean_logit_diff": scores[h][1] if h in scores else None,
                }
                for h in remaining
            ]
            kept = [h for h in all_heads if h not in removed]
            record(point_from(len(removed), best, kept, res, passes=len(confirm), attribution_passes=n_attr,
                              seconds=time.perf_counter() - t0, candidates=candidates))
            bar.set_postfix(kept=len(kept), faithfulness=f"{res.faithfulness:.3f}")
            bar.update(1)
    finally:
        bar.close()

    result = finish(model, tok, ans, cfg, base, cache, all_heads, curve, passes_run, n_dropped, batch_size)
    result.seconds_run = time.perf_counter() - t_start
    return result


def prune_identity(cfg: PruneConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The run identity of a pruning run (the keys of the first release, so that its directories resume)."""
    ad = adapt(model)
    return {
        "command": "prune",
        **cfg.subgraph_fields(),
        "n_boot": cfg.n_boot,
        "seed": cfg.seed,
        "prompts_sha256": tokens_sha256(ctx.given_tokens, ctx.given_answers),
        "model": ad.model_identity(),
        "cache_sha256": (ctx.means_identity or {}).get("cache_sha256"),
        "means": ctx.means_identity,
        "meta": {k: v for k, v in ctx.meta.items() if k not in NOT_IDENTITY},
    }


def prune_schema(cfg: PruneConfig, info: ModelInfo, n_prompts: int) -> RecordSchema:
    """The schema of a ``curve.jsonl`` line (the path itself is checked by :func:`check_row`)."""
    n_heads = cfg.transfer * info.n_heads
    return RecordSchema(
        fields=(Field("step", "int", 0, n_heads), Field("removed", "list", nullable=True),
                Field("heads_kept", "list"), Field("n_heads_kept", "int", 0, n_heads),
                *faithfulness_fields(n_prompts), Field("passes", "int", 0), Field("attribution_passes", "int", 0, 1),
                Field("seconds", "float", 0.0), Field("candidates", "list")),
        key=("step",),
    )


def prompt_records(ctx: RunContext) -> list[JsonDict]:
    """One ``prompts.jsonl`` record per base-correct prompt: ``index`` (among the given prompts), the
    caller's record (if any), token ids and answer token id."""
    return [
        {"index": i, **(dict(ctx.prompts[i]) if ctx.prompts is not None else {}),
         "tokens": ctx.given_tokens[i].tolist(), "answer_token": ctx.given_answers[i].tolist()}
        for i in range(ctx.n_given)
        if bool(ctx.keep[i])
    ]


def write_prune_outputs(result: PruneResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``summary.json`` and ``report.html`` of a finished pruning run."""
    from circuits.prune.report import write_prune_report

    run_dir.write_json(files.SUMMARY, {**summary_dict(result, ctx.meta), "fit": ctx.means_summary()})
    write_prune_report(run_dir.path / files.REPORT, result, ctx.meta, notes=[n for n in [ctx.means_note()] if n])


def check_row(point: CurvePoint, index: int, all_heads: list[Head]) -> CurvePoint:
    """A replayed ``curve.jsonl`` row must continue the path: consecutive step, a head still kept."""
    if point.step != index:
        raise CorruptRunError(f"curve.jsonl is inconsistent: row {index} has step {point.step}")
    if index > 0 and point.removed not in all_heads:
        raise CorruptRunError(f"curve.jsonl row {index} removes {point.removed}, which is not a transfer head")
    if point.removed in point.heads_kept or len(point.heads_kept) != len(all_heads) - index:
        raise CorruptRunError(f"curve.jsonl row {index} is inconsistent: it keeps {len(point.heads_kept)} heads")
    return point


def finish(
    model: Model,
    tok: Int[torch.Tensor, "batch pos"],
    ans: Int[torch.Tensor, " batch *k"],
    cfg: PruneConfig,
    base: list[iv.Intervention],
    cache: iv.MeanCache | None,
    all_heads: list[Head],
    curve: list[CurvePoint],
    passes_run: int,
    n_dropped: int,
    batch_size: int,
) -> PruneResult:
    hits = [p for p in curve if p.faithfulness >= cfg.target]
    smallest = hits[-1] if hits else None
    attention: dict[Head, list[float]] = {}
    if smallest is not None and smallest.heads_kept:
        removed = [h for h in all_heads if h not in smallest.heads_kept]
        att = head_attention(model, tok, smallest.heads_kept, pruned_subgraph(base, removed, cfg.method, cache),
                             batch_size=batch_size)
        attention = {h: v.tolist() for h, v in att.items()}
    return PruneResult(
        config=cfg,
        transfer_heads=list(all_heads),
        curve=curve,
        smallest_head_set=list(smallest.heads_kept) if smallest is not None else None,
        smallest_step=smallest.step if smallest is not None else None,
        smallest_faithfulness=smallest.faithfulness if smallest is not None else None,
        auc=area_under_curve([p.faithfulness for p in curve]),
        passes_total=sum(p.passes for p in curve),
        attribution_passes_total=sum(p.attribution_passes for p in curve),
        passes_run=passes_run,
        seconds=sum(p.seconds for p in curve),
        seconds_run=0.0,
        n_prompts=int(tok.shape[0]),
        n_dropped=n_dropped,
        attention=attention,
        key_labels=key_labels(model, tok),
    )


def prune_validate(cfg: PruneConfig, info: ModelInfo) -> None:
    """:meth:`PruneConfig.validate` against the model's number of blocks."""
    cfg.validate(info.n_layers)


def prune_means(cfg: PruneConfig) -> Means | None:
    """The means of the residual ablation and, for mean head ablation, of the heads' outputs."""
    return means_kind(cfg.ablation, cfg.method)


def prune_row(result: PruneResult) -> JsonDict:
    """A sweep row of a pruning run: its subgraph and the faithfulness of the smallest head set that keeps
    the target (none: empty)."""
    return {"wait": result.config.wait, "transfer": result.config.transfer,
            "faithfulness": result.smallest_faithfulness, "selected": result.smallest_head_set is not None}


PRUNE: Analysis[PruneConfig, PruneResult] = Analysis(
    name="prune",
    config_type=PruneConfig,
    results_file=files.PRUNE_CURVE,
    validate=prune_validate,
    identity=prune_identity,
    schema=prune_schema,
    run=run_prune,
    write=write_prune_outputs,
    means=prune_means,
    prompt_records=prompt_records,
    summary_row=prune_row,
)
"""Greedy head pruning as the runner runs it."""
