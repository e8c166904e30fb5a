"""The figures of a head-pruning run (plotly): the pruning curve (transfer heads kept vs faithfulness with its 95%
bootstrap interval and the target line), a block x head map of the smallest head set that stays >= target (with
the step at which every other head was removed), and what the surviving heads attend to from the last position.

Each takes the run's result (a :class:`~circuits.prune.result.PruneResult`, or anything with the fields of
:class:`PruneFigureData`); the result's ``plot_*`` methods and the report call them.
"""

from __future__ import annotations

from typing import Any, Protocol

from circuits.prune.config import PruneConfig
from circuits.prune.curve import CurvePoint
from interventions.types import Figure, Head

__all__ = ["PruneFigureData", "attention_figure", "curve_figure", "figures", "kept_heads_figure"]


class PruneFigureData(Protocol):
    """What the figures read of a pruning result (:class:`~circuits.prune.result.PruneResult` has it)."""

    config: PruneConfig
    transfer_heads: list[Head]
    curve: list[CurvePoint]
    smallest_head_set: list[Head] | None
    auc: float
    passes_total: int
    attention: dict[Head, list[float]]
    key_labels: list[str]


ROW_PX = 28
"""Height of one head's row in the attention map (pixels)."""
MAX_HEIGHT = 1200
"""The attention map stops growing here (about 36 heads); hover names the rows beyond."""
MAX_LABELLED_CELLS = 400
MAX_LABELLED_HEADS = 24
"""The attention map writes each cell's value while it has at most this many cells and heads."""


def curve_figure(result: PruneFigureData) -> Figure:
    import plotly.graph_objects as go

    kept = [p.n_heads_kept for p in result.curve]
    faith = [p.faithfulness for p in result.curve]
    hover = [
        f"step {p.step}<br>removed {tuple(p.removed) if p.removed else '-'}<br>kept {p.n_heads_kept}"
        f"<br>faithfulness {p.faithfulness:.3f} [{p.ci_low:.3f}, {p.ci_high:.3f}]"
        f"<br>P(answer) {p.mean_answer_prob:.3f}<br>logit diff {p.mean_logit_diff:.3f}"
        for p in result.curve
    ]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=kept,
            y=faith,
            mode="lines+markers",
            name="faithfulness",
            text=hover,
            hoverinfo="text",
            error_y=dict(
                type="data",
                symmetric=False,
                array=[p.ci_high - p.faithfulness for p in result.curve],
                arrayminus=[p.faithfulness - p.ci_low for p in result.curve],
            ),
        )
    )
    fig.add_hline(y=result.config.target, line_dash="dash", annotation_text=f"target {result.config.target:g}",
                  annotation_position="bottom left")
    if result.smallest_head_set is not None:
        # Labelled at the bottom of its line, where the curve (high up at the smallest set) does not run.
        fig.add_vline(x=len(result.smallest_head_set), line_dash="dot", annotation_position="bottom right",
                      annotation_text=f"smallest set: {len(result.smallest_head_set)} heads")
    n_max = max(kept, default=0)
    fig.update_layout(
        title=f"Greedy head pruning (AUC {result.auc:.3f}, {result.passes_total} confirmed passes)",
        xaxis=dict(title="transfer heads kept", range=[n_max + 0.5, -0.5], tickformat="d",  # reversed: pruning
                   dtick=1 if n_max <= 24 else None),
        yaxis_title="faithfulness",
        yaxis_range=[-0.02, 1.02],
    )
    return fig


def kept_heads_figure(result: PruneFigureData) -> Figure:
    import plotly.graph_objects as go

    layers = sorted({layer for layer, _ in result.transfer_heads})
    n_heads = max(head for _, head in result.transfer_heads) + 1
    kept = set(result.smallest_head_set or [])
    step_of = {p.removed: p.step for p in result.curve if p.removed is not None}
    z = [[1.0 if (layer, head) in kept else 0.0 for head in range(n_heads)] for layer in layers]
    hover = [
        [
            f"L{layer} H{head}: "
            + ("kept" if (layer, head) in kept else f"removed at step {step_of.get((layer, head))}")
            for head in range(n_heads)
        ]
        for layer in layers
    ]
    cell = [["kept" if (layer, head) in kept else f"step {step_of.get((layer, head))}" for head in range(n_heads)]
            for layer in layers]
    xs, ys = [f"H{h}" for h in range(n_heads)], [f"L{layer}" for layer in layers]
    fig = go.Figure(
        go.Heatmap(
            z=z, x=xs, y=ys, text=cell, customdata=hover, texttemplate="%{text}",
            hovertemplate="%{customdata}<extra></extra>", colorscale=[[0, "#e8e8e8"], [1, "#1f77b4"]], zmin=0, zmax=1,
            showscale=False, xgap=2, ygap=2,
        )
    )
    # The legend: one entry per colour (the heatmap itself has none).
    for name, color in (("kept (in the smallest set)", "#1f77b4"), ("removed (at the step shown)", "#e8e8e8")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True,
                                 marker=dict(symbol="square", size=14, color=color, line=dict(color="#999", width=1))))
    fig.update_layout(
        title=f"Smallest head set with faithfulness >= {result.config.target:g}<br><sup>{len(kept)} of "
        f"{len(result.transfer_heads)} transfer heads kept</sup>",
        xaxis=dict(title="head", type="category", categoryorder="array", categoryarray=xs),
        yaxis=dict(title="block", type="category", categoryorder="array", categoryarray=ys, autorange="reversed"),
        # The legend right of the map: below it, it would cover the axis title.
        legend=dict(x=1.02, y=1, xanchor="left", yanchor="top"), height=max(300, 180 + 50 * len(layers)),
        width=max(640, 420 + 70 * n_heads), plot_bgcolor="white", margin=dict(t=90),
    )
    return fig


def attention_figure(result: PruneFigureData) -> Figure:
    import plotly.graph_objects as go

    heads = sorted(result.attention)
    cells = len(heads) * len(result.key_labels)
    fig = go.Figure(
        go.Heatmap(
            z=[result.attention[h] for h in heads],
            x=[f"{i}: {label}" for i, label in enumerate(result.key_labels)],
            y=[f"L{layer} H{head}" for layer, head in heads],
            colorscale="Viridis", zmin=0, zmax=1, colorbar=dict(title="attention"),
            # Values in the cells while they fit (hover gives them beyond).
            texttemplate="%{z:.2f}" if cells <= MAX_LABELLED_CELLS and len(heads) <= MAX_LABELLED_HEADS else None,
        )
    )
    fig.update_layout(
        title="Last position's mean attention of the kept heads (pruned subgraph)",
        xaxis=dict(title="key position", type="category"),
        yaxis=dict(title="head (first kept head on top)", type="category", autorange="reversed"),
        height=min(MAX_HEIGHT, max(320, 180 + ROW_PX * len(heads))),
    )
    return fig


def figures(result: PruneFigureData) -> list[Any]:
    """The report's figures: the curve, the smallest head set (when one reaches the target) and its attention."""
    figs = [curve_figure(result)]
    if result.smallest_head_set is not None:
        figs.append(kept_heads_figure(result))
    if result.attention:
        figs.append(attention_figure(result))
    return figs
