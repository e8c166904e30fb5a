"""The figures of an edge attribution run (plotly): the graph (nodes by block and position, the top edges drawn,
blue where removing the edge lowers the answer's margin, red where it raises it, width by ``|score|``) and the
faithfulness curve over circuit sizes with its bootstrap interval."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from circuits.edges.circuit import Curve

if TYPE_CHECKING:
    from interventions.types import Figure

__all__ = ["curve_figure", "graph_figure"]


def _column(name: str, n_layers: int) -> float:
    """x of a node: the embedding at -1, block ``l``'s heads at ``l``, its MLP at ``l + 0.5``, logits at the end."""
    if name == "embed":
        return -1.0
    if name == "logits":
        return float(n_layers)
    if name.startswith("mlp"):
        return int(name[3:]) + 0.5
    return float(int(name[1:].split("H")[0].split("KV")[0]))


def graph_figure(result: Any, n: int | None = None) -> Figure:
    """Nodes at (block, position), the ``n`` candidate edges of largest ``|score|`` as lines."""
    import plotly.graph_objects as go

    lay = result.layout
    edges = result.top(n)
    fig = go.Figure()
    biggest = max((abs(e["score"]) for e in edges), default=1.0) or 1.0
    for e in edges:
        x0, x1 = _column(e["src"], lay.n_layers), _column(e["dst"], lay.n_layers)
        y0, y1 = max(e["src_pos"], 0), max(e["dst_pos"], 0)
        fig.add_trace(go.Scatter(
            x=[x0, x1], y=[y0, y1], mode="lines", showlegend=False, hoverinfo="text",
            line={"width": 1 + 6 * abs(e["score"]) / biggest, "color": "#1f77b4" if e["score"] < 0 else "#d62728"},
            text=f"{e['src']}@{e['src_pos']} -> {e['dst']}@{e['dst_pos']} ({e['input']}): {e['score']:.3g}"))
    xs = [_column(s, lay.n_layers) for s in result.senders] + [float(lay.n_layers)]
    names = list(result.senders) + ["logits"]
    pos = list(range(lay.n_pos)) if lay.positional else [0]
    fig.add_trace(go.Scatter(
        x=[x for x in xs for _ in pos], y=[p for _ in xs for p in pos], mode="markers", name="nodes",
        marker={"size": 5, "color": "#888"}, text=[f"{nm}@{p}" for nm in names for p in pos], hoverinfo="text"))
    fig.update_layout(title=f"Top {len(edges)} edges (blue: the edge helps the answer)", xaxis_title="block",
                      yaxis_title="position", template="plotly_white", height=420 + 12 * len(pos))
    return fig


def curve_figure(curve: Curve) -> Figure:
    """Faithfulness (MIB) against the fraction of candidate edges kept, with its 95% bootstrap interval."""
    import plotly.graph_objects as go

    x = [p.fraction for p in curve.points]
    fig = go.Figure()
    band = [p.ci_high for p in curve.points] + [p.ci_low for p in curve.points][::-1]
    fig.add_trace(go.Scatter(x=x + x[::-1], y=band,
                             fill="toself", line={"width": 0}, name="95% interval", hoverinfo="skip",
                             fillcolor="rgba(31,119,180,0.2)"))
    fig.add_trace(go.Scatter(x=x, y=[p.faithfulness for p in curve.points], mode="lines+markers", name="faithfulness",
                             text=[f"{p.n_edges} edges, accuracy {p.accuracy:.3f}" for p in curve.points]))
    fig.update_layout(title=f"Edge-patching faithfulness: CPR {curve.cpr:.3f}, CMD {curve.cmd:.3f}",
                      xaxis={"title": "fraction of candidate edges kept", "type": "log"},
                      yaxis_title="faithfulness (1 = the model)", template="plotly_white")
    if not np.isfinite(curve.cpr):
        fig.update_layout(title="Edge-patching faithfulness")
    return fig
