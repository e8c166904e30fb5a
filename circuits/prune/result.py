"""Result records of head pruning: the curve points (lines of ``curve.jsonl``; field names and order
are part of the file format), the :class:`PruneResult` and its ``summary.json``."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from circuits.errors import ArgumentError
from circuits.prune import figures as prune_figures
from circuits.prune.config import PruneConfig
from circuits.prune.curve import CURVE_FIELDS, CurvePoint
from circuits.store import fields as jf  # typed fields of run.json and summary.json
from circuits.store.runs import dist_version
from circuits.tasks.formats import describe_prompts
from circuits.vocab import ABLATIONS, HEAD_METHODS, RANKS, Ablation, HeadMethod, Rank
from interventions.types import DataFrame, Figure, Head, JsonDict, JsonMapping


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

    @classmethod
    def load(cls, run_dir: str | Path) -> PruneResult:
        """The pruning run stored in ``run_dir`` (``af1 prune --out``, :func:`prune_heads` with ``out_dir``),
        without a model: the configuration from ``run.json``, the curve from ``curve.jsonl`` and the target,
        the smallest head set, its attention and the timings from ``summary.json`` (``FileNotFoundError``
        while the run has not finished)."""
        from circuits.prune.heads import transfer_heads
        from circuits.store import files
        from circuits.store.runs import read_json_object, read_jsonl

        path = Path(run_dir)
        for name in (files.IDENTITY, files.SUMMARY):
            if not (path / name).is_file():
                raise FileNotFoundError(f"{path} holds no {name}: not a finished pruning run")
        ident, summary = read_json_object(path / files.IDENTITY), read_json_object(path / files.SUMMARY)
        ip, sp = path / files.IDENTITY, path / files.SUMMARY  # every field read below names its file when bad
        confirm = jf.integer(ident, "confirm_top", ip, None, minimum=1)
        cfg = PruneConfig(wait=jf.integer(ident, "wait", ip, minimum=-1), transfer=jf.integer(ident, "transfer", ip),
                          ablation=cast(Ablation, jf.choice(ident, "ablation", ip, ABLATIONS)),
                          method=cast(HeadMethod, jf.choice(ident, "method", ip, HEAD_METHODS)),
                          target=jf.fraction(summary, "target", sp),
                          rank=cast(Rank, jf.choice(ident, "rank", ip, RANKS)),
                          confirm_top=confirm, batch_size=jf.integer(summary, "batch_size", sp, 128, minimum=1),
                          n_boot=jf.integer(ident, "n_boot", ip, minimum=1), seed=jf.integer(ident, "seed", ip))
        signature = jf.mapping(ident, "model", ip)
        n_layers = jf.integer({"model.n_layers": signature.get("n_layers")}, "model.n_layers", ip, minimum=1)
        n_heads = jf.integer({"model.n_heads": signature.get("n_heads")}, "model.n_heads", ip, minimum=1)
        heads = transfer_heads(n_layers, n_heads, cfg.wait, cfg.transfer)
        curve = [CurvePoint.from_dict(r) for r in read_jsonl(path / files.PRUNE_CURVE)]
        smallest = summary.get("smallest_head_set")
        attention = jf.mapping(summary, "attention", sp, {})
        return cls(
            config=cfg, transfer_heads=heads, curve=curve,
            smallest_head_set=[tuple(h) for h in smallest] if smallest is not None else None,
            smallest_step=summary.get("smallest_step"), smallest_faithfulness=summary.get("smallest_faithfulness"),
            auc=jf.number(summary, "auc", sp), passes_total=jf.integer(summary, "passes_total", sp),
            attribution_passes_total=jf.integer(summary, "attribution_passes_total", sp),
            passes_run=jf.integer(summary, "passes_run", sp), seconds=jf.number(summary, "seconds", sp),
            seconds_run=jf.number(summary, "seconds_run", sp), n_prompts=jf.integer(summary, "n_prompts", sp),
            n_dropped=jf.integer(summary, "n_dropped", sp),
            attention={cast(Head, tuple(int(x) for x in k.split("."))): v
                       for k, v in (attention.get("heads") or {}).items()},
            key_labels=list(attention.get("key_labels") or []),
        )

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame`` of the curve: one row per step (:data:`CURVE_FIELDS` but the candidates)."""
        from circuits.store.frames import dataframe

        cols = [c for c in CURVE_FIELDS if c != "candidates"]
        return dataframe([{k: getattr(p, k) for k in cols} for p in self.curve], cols)

    def plot_curve(self) -> Any:
        """The report's pruning curve: heads kept vs faithfulness with its interval and the target."""
        return prune_figures.curve_figure(self)

    def plot_kept_heads(self) -> Any:
        """The report's block x head map of the smallest head set (``ValueError`` if none reaches the target)."""
        if self.smallest_head_set is None:
            raise ArgumentError(f"no head set reaches the target {self.config.target:g}: nothing to map")
        return prune_figures.kept_heads_figure(self)

    def plot_attention(self) -> Any:
        """The report's map of what the kept heads attend to from the last position."""
        if not self.attention:
            raise ArgumentError("no kept head: no attention to show")
        return prune_figures.attention_figure(self)

    def plot(self) -> Figure:
        """:meth:`plot_curve` (shows inline in a notebook)."""
        return self.plot_curve()

    def figures(self) -> list[Any]:
        """Every figure of the report, in its order."""
        return prune_figures.figures(self)

    @property
    def removal_order(self) -> list[Head]:
        return [p.removed for p in self.curve[1:] if p.removed is not None]


def area_under_curve(faithfulness: Sequence[float]) -> float:
    """Trapezoid area under faithfulness (y) vs fraction of heads removed (x = step / n_steps)."""
    n = len(faithfulness) - 1
    if n < 1:
        raise ArgumentError("the curve needs at least two points")
    return float(sum((a + b) / 2 for a, b in zip(faithfulness[:-1], faithfulness[1:])) / n)


def versions() -> dict[str, str | None]:
    import circuits

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lens": dist_version("transformer-lens"),
        "circuits": circuits.__version__,
    }


def summary_dict(result: PruneResult, meta: JsonMapping) -> JsonDict:
    """The JSON object written to ``summary.json``."""
    cfg = result.config
    smallest = result.curve[result.smallest_step] if result.smallest_step is not None else None
    return {
        **{k: v for k, v in meta.items()},
        "prompt_format": describe_prompts(meta),
        **cfg.subgraph_fields(),
        "target": cfg.target,
        "batch_size": cfg.batch_size,
        "n_prompts": result.n_prompts,
        "n_dropped": result.n_dropped,
        "n_transfer_heads": len(result.transfer_heads),
        "smallest_head_set": ([list(h) for h in result.smallest_head_set]
                              if result.smallest_head_set is not None else None),
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
        "versions": versions(),
    }
