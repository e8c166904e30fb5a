"""Greedy head pruning inside the AF1 subgraph.

The AF1 subgraph of ``(wait, transfer)`` (:func:`interventions.af1_subgraph`: ablation of the residual
after block ``wait``, transfer blocks ``wait+1 .. wait+transfer`` where the last token full-peeks, every
later block self-peeks) is the starting point. Its *transfer heads* are every query head of the
transfer blocks (``transfer * n_heads`` heads, named ``(layer, head)``, 0-indexed). They are removed
one at a time (:class:`interventions.HeadAblation`, ``method="zero"`` or ``"mean"``) until none is
left, and the whole curve "heads kept vs faithfulness" is recorded.

Criterion ("removes the head that hurts least"). At every step, among the candidates whose removal
was *confirmed* by a real ablation (a forward pass over all prompts with the already removed heads
plus the candidate ablated), the chosen head maximises, in this order:

1. faithfulness after removal (fraction of base-correct prompts whose argmax is still the answer);
2. then the mean logit difference after removal (answer logit minus best other logit, in logits);
3. then the lowest ``(layer, head)`` (deterministic tie-break).

The choice is recomputed after each removal (greedy). Which candidates are confirmed:

* ``rank="attribution"``: one forward + one backward pass on the current pruned subgraph gives, for
  every remaining head, the first-order estimate of the change of the summed logit difference when it
  is removed (:mod:`circuits.attribution`); candidates are sorted by estimate, highest first (ties:
  lowest ``(layer, head)``), and the first ``confirm_top`` of them are confirmed
  (``confirm_top=None``: all of them, which makes the greedy step exact, the estimates then only
  being recorded for diagnostics).
* ``rank="none"``: no attribution pass; every remaining head is confirmed (``confirm_top`` must be
  None).

Cost, in forward passes over the whole prompt set (a *pass*; each may run in several batches): 1 for
the unpruned subgraph, then per step ``min(confirm_top, remaining)`` confirmed passes plus, with
``rank="attribution"``, one forward+backward pass. Exact greedy: ``1 + H(H+1)/2`` confirmed passes for
``H`` transfer heads; ``confirm_top=k``: at most ``1 + k*H``.

Outputs (``out_dir``): ``run.json`` (what identifies the run), ``curve.jsonl`` (one JSON object per
step, appended and fsynced as soon as known), ``summary.json``, ``report.html``, ``prompts.jsonl``,
``means.safetensors``. A second call with the same ``out_dir`` continues from ``curve.jsonl`` by
replaying the removed heads (finished steps are not recomputed); a directory holding another run's
results raises :class:`FileExistsError`. ``target``, ``batch_size`` and ``progress`` are not part of a
run's identity: rerunning with another ``target`` only recomputes the summary and the report.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

import interventions as iv
from interventions import adapter as hooks
from interventions.adapter import adapt, new_hook_level
from interventions.types import Head, Tokens
from interventions.validation import check_choice, check_tokens

from .attribution import head_attribution
from .faithfulness import FaithfulnessResult, base_correct, last_logits, last_token_metrics, summarize
from .runs import RunDir
from .runs import dist_version, tokens_sha256

METHODS = ("zero", "mean")
RANKS = ("attribution", "none")
ABLATIONS = ("cama", "mean", "zero")
NOT_IDENTITY = ("command", "base_accuracy", "n_checked")
"""``meta`` keys that describe a run without changing its results (not part of its identity)."""
CURVE_FIELDS = (
    "step", "removed", "heads_kept", "n_heads_kept", "faithfulness", "ci_low", "ci_high", "n",
    "mean_answer_prob", "mean_logit_diff", "passes", "attribution_passes", "seconds", "candidates",
)


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run. ``wait``/``transfer`` as in :func:`interventions.af1_subgraph`
    (0-indexed last waiting block; number of transfer blocks); ``target`` is a faithfulness fraction."""

    wait: int
    transfer: int
    ablation: str = "cama"
    method: str = "zero"
    target: float = 0.9
    rank: str = "attribution"
    confirm_top: int | None = None
    batch_size: int = 128
    n_boot: int = 1000
    seed: int = 0

    def validate(self, n_layers: int) -> None:
        """Raise ``ValueError`` naming the bad value and the valid range."""
        if not isinstance(self.wait, int) or not -1 <= self.wait <= n_layers - 2:
            raise ValueError(
                f"wait={self.wait!r} is out of range: valid -1..{n_layers - 2} for a model of {n_layers} "
                f"blocks (at least one transfer block must follow the last waiting block)"
            )
        if not isinstance(self.transfer, int) or self.transfer == 0:
            raise ValueError(
                f"transfer={self.transfer!r}: head pruning needs transfer heads, give transfer "
                f"1..{n_layers - 1 - self.wait} for wait={self.wait}"
            )
        if not 1 <= self.transfer <= n_layers - 1 - self.wait:
            raise ValueError(
                f"transfer={self.transfer} is out of range for wait={self.wait}: valid "
                f"1..{n_layers - 1 - self.wait} ({n_layers} blocks)"
            )
        check_choice("ablation", self.ablation, ABLATIONS)
        check_choice("method", self.method, METHODS)
        check_choice("rank", self.rank, RANKS)
        if not 0.0 <= float(self.target) <= 1.0:
            raise ValueError(f"target={self.target} is out of range: a faithfulness fraction in [0, 1]")
        if self.confirm_top is not None:
            if self.rank != "attribution":
                raise ValueError(
                    f"confirm_top={self.confirm_top} needs rank='attribution' (rank='none' confirms every "
                    f"candidate)"
                )
            if not isinstance(self.confirm_top, int) or isinstance(self.confirm_top, bool) or self.confirm_top < 1:
                raise ValueError(f"confirm_top={self.confirm_top!r} must be an integer >= 1 (or None = all)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")


@dataclass
class CurvePoint:
    """One point of the pruning curve: the state after step ``step`` (step 0: nothing removed).

    ``removed``: the head removed at this step (None at step 0); ``heads_kept``: transfer heads still
    present; metrics as in :class:`circuits.faithfulness.FaithfulnessResult`; ``passes``: confirmed
    forward passes spent on this step; ``attribution_passes``: forward+backward passes (0 or 1);
    ``candidates``: per remaining head before the removal, its attribution ``estimate`` (None without
    attribution) and, if confirmed, its ``faithfulness`` and ``mean_logit_diff`` after removal.
    """

    step: int
    removed: Head | None
    heads_kept: list[Head]
    n_heads_kept: int
    faithfulness: float
    ci_low: float
    ci_high: float
    n: int
    mean_answer_prob: float
    mean_logit_diff: float
    passes: int
    attribution_passes: int
    seconds: float
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["removed"] = list(self.removed) if self.removed is not None else None
        out["heads_kept"] = [list(h) for h in self.heads_kept]
        return out

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> "CurvePoint":
        data = {k: row[k] for k in CURVE_FIELDS}
        data["removed"] = tuple(row["removed"]) if row["removed"] is not None else None
        data["heads_kept"] = [tuple(h) for h in row["heads_kept"]]
        return cls(**data)


@dataclass
class PruneResult:
    """Outcome of :func:`prune_heads`.

    ``curve`` has ``len(transfer_heads) + 1`` points (0 heads removed .. all removed).
    ``smallest_head_set``: the heads kept at the last curve point whose faithfulness is >= ``target``
    (fewest heads kept), None if even the unpruned subgraph is below target. ``auc``: trapezoid area
    under faithfulness vs fraction of transfer heads removed, in [0, 1]. ``passes_total``: confirmed
    forward passes of the whole curve; ``passes_run``: of them, those spent by this call (0 when it
    only replayed a finished run). ``attention``: per head of the smallest set, the last position's
    mean attention over key positions under the pruned subgraph (:func:`head_attention`).
    """

    config: PruneConfig
    transfer_heads: list[Head]
    curve: list[CurvePoint]
    smallest_head_set: list[Head] | None
    smallest_step: int | None
    smallest_faithfulness: float | None
    auc: float
    passes_total: int
    attribution_passes_total: int
    passes_run: int
    seconds: float
    seconds_run: float
    n_prompts: int
    n_dropped: int
    attention: dict[Head, list[float]]
    key_labels: list[str]

    @property
    def removal_order(self) -> list[Head]:
        return [p.removed for p in self.curve[1:] if p.removed is not None]


# --- subgraph and evaluation -------------------------------------------------------------------


def transfer_heads(n_layers: int, n_heads: int, wait: int, transfer: int) -> list[Head]:
    """Every query head of the transfer blocks ``wait+1 .. wait+transfer``, sorted by (layer, head)."""
    return [(layer, head) for layer in range(wait + 1, wait + 1 + transfer) for head in range(n_heads)]


def pruned_subgraph(
    base: Sequence[iv.Intervention], removed: Sequence[Head], method: str, cache: iv.MeanCache | None
) -> list[iv.Intervention]:
    """``base`` plus a :class:`HeadAblation` of ``removed`` (nothing added when ``removed`` is empty)."""
    items = list(base)
    if removed:
        items.append(iv.HeadAblation(heads=tuple(sorted(removed)), method=method, cache=cache))
    return items


@torch.inference_mode()
def head_attention(
    model: Any,
    tokens: Tokens,
    heads: Sequence[Head],
    interventions: Sequence[iv.Intervention] = (),
    *,
    batch_size: int = 128,
) -> dict[Head, Float[torch.Tensor, "pos"]]:
    """What ``heads`` attend to: the last position's attention pattern (post-softmax, after the
    interventions' masks), averaged over prompts, per key position ``0 .. pos-1`` (BOS at 0)."""
    tokens = check_tokens(tokens)
    ad = adapt(model)
    heads = sorted({tuple(h) for h in heads})
    for layer, head in heads:
        ad.info.check_head(layer, head)
    layers = sorted({layer for layer, _ in heads})
    sums = {layer: torch.zeros(ad.info.n_heads, tokens.shape[1], dtype=torch.float64) for layer in layers}

    def make(layer: int):
        def fn(pattern: torch.Tensor, hook: Any = None) -> None:
            sums[layer] += pattern[:, :, -1].detach().double().sum(0).cpu()

        return fn

    names = [hooks.pattern(layer) for layer in layers]
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(ad.device())
        level = new_hook_level()
        with iv.apply(model, list(interventions)):
            try:
                for layer, name in zip(layers, names):
                    ad.add_hook(name, make(layer), level)
                model(batch)
            finally:
                ad.remove_hooks(names, level)
    n = tokens.shape[0]
    return {(layer, head): (sums[layer][head] / n).float() for layer, head in heads}


def key_labels(model: Any, tokens: Tokens) -> list[str]:
    """A label per key position: the token's text where every prompt holds the same token there
    (``#id`` without a tokenizer), else ``pos {i}`` (a varying position such as an operand)."""
    labels = []
    for pos in range(tokens.shape[1]):
        col = tokens[:, pos]
        if bool((col == col[0]).all()):
            tok = int(col[0])
            text = None
            if getattr(model, "tokenizer", None) is not None:
                try:
                    text = model.tokenizer.decode([tok])
                except Exception:  # noqa: BLE001 - a label only
                    text = None
            labels.append(repr(text) if text is not None else f"#{tok}")
        else:
            labels.append(f"pos {pos}")
    return labels


def _criterion(head: Head, faith: float, diff: float) -> tuple:
    """Sort key: the smallest key hurts least (highest faithfulness, then logit diff, then head)."""
    return (-faith, -diff, head)


def _versions() -> dict[str, str | None]:
    import circuits

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lens": dist_version("transformer-lens"),
        "circuits": circuits.__version__,
    }


# --- the greedy loop ---------------------------------------------------------------------------


def prune_heads(
    model: Any,
    tokens: Tokens,
    answers: Int[torch.Tensor, "batch"],
    *,
    wait: int,
    transfer: int,
    cache: iv.MeanCache | None = None,
    ablation: Literal["cama", "mean", "zero"] = "cama",
    method: Literal["zero", "mean"] = "zero",
    target: float = 0.9,
    rank: Literal["attribution", "none"] = "attribution",
    confirm_top: int | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    batch_size: int = 128,
    n_boot: int = 1000,
    seed: int = 0,
    meta: Mapping[str, Any] | None = None,
    prompts: Sequence[Mapping[str, Any]] | None = None,
) -> PruneResult:
    """Greedily remove the transfer heads of the AF1 subgraph ``(wait, transfer)``; see the module
    docstring for the criterion, the cost and the files written to ``out_dir``.

    ``tokens``: ``[batch, pos]`` prompts of one layout (BOS at 0); ``answers``: answer token ids.
    Prompts the unmodified model gets wrong are dropped first (``n_dropped``). ``cache``: the MeanCache
    for ``ablation="cama"|"mean"`` and ``method="mean"`` (per-position means of ``hook_z``).
    ``meta`` (e.g. ``model``, ``task``, ``source``) is part of the run's identity (except the keys
    ``command``, ``base_accuracy`` and ``n_checked``, which describe it) and is copied into
    ``summary.json``. ``prompts``: records aligned with ``tokens`` (e.g. ``{"prompt", "answer"}``)
    extended with the token ids and written to ``prompts.jsonl`` for the base-correct prompts.
    """
    t_start = time.perf_counter()
    ad = adapt(model)
    info = ad.info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = torch.as_tensor(answers, dtype=torch.long)
    if answers.shape != (tokens.shape[0],):
        raise ValueError(
            f"answers must hold one token id per prompt: got shape {tuple(answers.shape)} for "
            f"{tokens.shape[0]} prompts"
        )
    cfg = PruneConfig(wait, transfer, ablation, method, float(target), rank, confirm_top, batch_size, n_boot, seed)
    cfg.validate(info.n_layers)
    if method == "mean" and cache is None:
        raise ValueError("method='mean' needs cache=MeanCache.fit(model, tokens) (per-position head means)")
    base = iv.af1_subgraph(info.n_layers, wait, transfer, cache, ablation)
    all_heads = transfer_heads(info.n_layers, info.n_heads, wait, transfer)
    n_total = len(all_heads)

    keep = base_correct(model, tokens, answers, batch_size=batch_size)
    n_dropped = int((~keep).sum())
    if not bool(keep.any()):
        raise ValueError("the unmodified model answers none of these prompts correctly: nothing to prune")
    tok, ans = tokens[keep], answers[keep]

    run_dir: RunDir | None = None
    rows: list[dict[str, Any]] = []
    if out_dir is not None:
        identity = {
            "command": "prune",
            "wait": wait,
            "transfer": transfer,
            "ablation": ablation,
            "method": method,
            "rank": rank,
            "confirm_top": confirm_top,
            "n_boot": n_boot,
            "seed": seed,
            "prompts_sha256": tokens_sha256(tokens, answers),
            "model": {**info.signature(), "fingerprint": ad.fingerprint()},
            "cache_sha256": cache.sha256 if cache is not None else None,
            "meta": {k: v for k, v in (meta or {}).items() if k not in NOT_IDENTITY},
        }
        run_dir = RunDir(out_dir, identity, results_name="curve.jsonl").open()
        if cache is not None and not (run_dir.path / "means.safetensors").exists():
            cache.save(run_dir.path / "means.safetensors")
        if not (run_dir.path / "prompts.jsonl").exists():
            run_dir.write_jsonl("prompts.jsonl", _prompt_records(tokens, answers, keep, prompts))
        rows = run_dir.load_records()

    curve = [_check_row(CurvePoint.from_dict(r), i, all_heads) for i, r in enumerate(rows)]
    if curve and curve[0].n != int(tok.shape[0]):
        raise ValueError(
            f"curve.jsonl was computed on {curve[0].n} base-correct prompts but the model now answers "
            f"{int(tok.shape[0])} of them correctly: the model changed; use a new output directory"
        )
    removed: list[Head] = [p.removed for p in curve[1:] if p.removed is not None]
    passes_run = 0

    def evaluate(heads_removed: Sequence[Head]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ivs = pruned_subgraph(base, heads_removed, method, cache)
        return last_token_metrics(last_logits(model, tok, ivs, batch_size=batch_size), ans)

    def record(point: CurvePoint) -> None:
        curve.append(point)
        if run_dir is not None:
            run_dir.append(point.to_dict())

    def point_from(step: int, head: Head | None, kept: list[Head], res: FaithfulnessResult, **kw: Any) -> CurvePoint:
        return CurvePoint(
            step=step, removed=head, heads_kept=kept, n_heads_kept=len(kept), faithfulness=res.faithfulness,
            ci_low=res.ci_low, ci_high=res.ci_high, n=res.n, mean_answer_prob=res.mean_answer_prob,
            mean_logit_diff=res.mean_logit_diff, **kw,
        )

    bar = tqdm(total=n_total + 1, initial=len(curve), desc="prune heads", unit="step", disable=not progress)
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
            metrics: dict[Head, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
            for head in confirm:
                metrics[head] = evaluate(removed + [head])
            passes_run += len(confirm)
            scores = {h: (float(m[0].float().mean()), float(m[2].float().mean())) for h, m in metrics.items()}
            best = min(confirm, key=lambda h: _criterion(h, *scores[h]))
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

    result = _finish(model, tok, ans, cfg, base, cache, all_heads, curve, passes_run, n_dropped, batch_size)
    result.seconds_run = time.perf_counter() - t_start
    if run_dir is not None:
        run_dir.write_json("summary.json", summary_dict(result, meta or {}))
        from .prune_report import write_prune_report

        write_prune_report(run_dir.path / "report.html", result, meta or {})
    return result


def _check_row(point: CurvePoint, index: int, all_heads: list[Head]) -> CurvePoint:
    """A replayed ``curve.jsonl`` row must continue the path: consecutive step, a head still kept."""
    if point.step != index:
        raise ValueError(f"curve.jsonl is inconsistent: row {index} has step {point.step}")
    if index > 0 and point.removed not in all_heads:
        raise ValueError(f"curve.jsonl row {index} removes {point.removed}, which is not a transfer head")
    if point.removed in point.heads_kept or len(point.heads_kept) != len(all_heads) - index:
        raise ValueError(f"curve.jsonl row {index} is inconsistent: it keeps {len(point.heads_kept)} heads")
    return point


def _prompt_records(
    tokens: torch.Tensor,
    answers: torch.Tensor,
    keep: torch.Tensor,
    prompts: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, Any]]:
    """One ``prompts.jsonl`` record per base-correct prompt: ``index`` (in ``tokens``), the caller's
    record (if any), token ids and answer token id."""
    if prompts is not None and len(prompts) != tokens.shape[0]:
        raise ValueError(f"prompts has {len(prompts)} records for {tokens.shape[0]} prompts")
    return [
        {"index": i, **(dict(prompts[i]) if prompts is not None else {}), "tokens": tokens[i].tolist(),
         "answer_token": int(answers[i])}
        for i in range(tokens.shape[0])
        if bool(keep[i])
    ]


def area_under_curve(faithfulness: Sequence[float]) -> float:
    """Trapezoid area under faithfulness (y) vs fraction of heads removed (x = step / n_steps)."""
    n = len(faithfulness) - 1
    if n < 1:
        raise ValueError("the curve needs at least two points")
    return float(sum((a + b) / 2 for a, b in zip(faithfulness[:-1], faithfulness[1:])) / n)


def _finish(
    model: Any,
    tok: torch.Tensor,
    ans: torch.Tensor,
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


def summary_dict(result: PruneResult, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object written to ``summary.json``."""
    cfg = result.config
    smallest = result.curve[result.smallest_step] if result.smallest_step is not None else None
    return {
        **{k: v for k, v in meta.items()},
        "wait": cfg.wait,
        "transfer": cfg.transfer,
        "ablation": cfg.ablation,
        "method": cfg.method,
        "rank": cfg.rank,
        "confirm_top": cfg.confirm_top,
        "target": cfg.target,
        "n_prompts": result.n_prompts,
        "n_dropped": result.n_dropped,
        "n_transfer_heads": len(result.transfer_heads),
        "smallest_head_set": [list(h) for h in result.smallest_head_set] if result.smallest_head_set is not None else None,
        "smallest_n_heads": len(result.smallest_head_set) if result.smallest_head_set is not None else None,
        "smallest_step": result.smallest_step,
        "smallest_faithfulness": result.smallest_faithfulness,
        "smallest_ci": [smallest.ci_low, smallest.ci_high] if smallest is not None else None,
        "unpruned_faithfulness": result.curve[0].faithfulness,
        "removal_order": [list(h) for h in result.removal_order],
        "auc": result.auc,
        "passes_total": result.passes_total,
        "attribution_passes_total": result.attribution_passes_total,
        "passes_run": result.passes_run,
        "seconds": result.seconds,
        "seconds_run": result.seconds_run,
        "attention": {
            "key_labels": result.key_labels,
            "heads": {f"{layer}.{head}": v for (layer, head), v in sorted(result.attention.items())},
        },
        "versions": _versions(),
    }
