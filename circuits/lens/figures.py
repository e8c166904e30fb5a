"""The figures of early decoding (plotly): one line chart per metric over depth (post-attention and post-MLP as
separate traces on the ordered axis ``L0 attn, L0 mlp, L1 attn, ...``, 95% bootstrap intervals as error bars), the
visibility of tracked prompt tokens, a heatmap of the answer rank per sub-layer over prompts, and the drop of the
answer probability under the interchange check.

Each takes a :class:`~circuits.lens.result.LensResult` (anything with the fields and methods of
:class:`LensFigureData`) or interchange results (:class:`InterchangeFigureData`); the results' ``plot`` methods and
the report call them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from circuits.lens.jsonable import json_ready
from interventions.types import Figure, JsonDict, JsonMapping

__all__ = ["InterchangeFigureData", "LensFigureData", "MAX_HEATMAP_PROMPTS", "MAX_TRACKED_LINES", "METRICS", "TITLES",
           "figures", "interchange_figure", "metric_figure", "rank_heatmap", "tracked_figure"]

METRICS = ("answer_prob", "answer_rank", "numeric_mass", "top1_numeric", "top10_numeric", "abs_error")
"""The per-prompt metrics of early decoding, in the report's order."""


class LensFigureData(Protocol):
    """What the figures read of an early-decoding result (:class:`~circuits.lens.result.LensResult` has it)."""

    sublayers: tuple[str, ...]
    tracked: list[str]
    top_k: int
    prompts: list[str]

    @property
    def n_prompts(self) -> int: ...

    def labels(self) -> list[str]: ...

    def flat(self, metric: str) -> np.ndarray: ...

    def rows(self, *, n_boot: int = 1000, seed: int = 0) -> list[JsonDict]: ...


class InterchangeFigureData(Protocol):
    """What the interchange figure reads of one check (:class:`~circuits.lens.interchange_check.InterchangeResult`)."""

    label: str
    clean_prob: np.ndarray

    def rows(self) -> list[JsonDict]: ...


TITLES = {
    "answer_prob": "Probability of the correct answer",
    "answer_rank": "Rank of the correct answer (0 = top-1)",
    "numeric_mass": "Probability mass on numeric tokens",
    "top1_numeric": "Share of prompts whose top-1 token is numeric",
    "top10_numeric": "Share of numeric tokens among the top-10",
    "abs_error": "|top numeric prediction - answer|",
}
MAX_HEATMAP_PROMPTS = 200
MAX_TRACKED_LINES = 4
"""Tracked prompt tokens drawn one by one in the tracked-token chart (two lines each: post-attention, post-MLP); the
others are averaged into one (:func:`tracked_figure`)."""
REST_KEY = "visible_rest"
"""The row key of the averaged tracked tokens in :func:`tracked_figure`."""


YLABELS = {
    "answer_prob": "P(correct answer)",
    "answer_rank": "rank of the answer + 1 (1 = top-1, log scale)",
    "numeric_mass": "probability on numeric tokens",
    "top1_numeric": "share of prompts",
    "top10_numeric": "share of the top-10",
    "abs_error": "|prediction - answer| (answer units)",
}
"""The y-axis title of each metric's chart."""
FRACTIONS = ("answer_prob", "numeric_mass", "top1_numeric", "top10_numeric")
"""Metrics in [0, 1]: their charts keep the axis at [0, 1] (a constant curve stays where it is)."""
HEATMAP_ROW_PX = 12
MAX_LABELLED_ROWS = 60
"""Prompts beyond which the rank heatmap keeps a fixed height and drops its per-prompt labels (hover names them)."""


def _line_chart(result: LensFigureData, rows: Sequence[JsonMapping], title: str, keys: Sequence[tuple[str, str]],
                yaxis: str, *, shift: float = 0.0, log: bool = False, fraction: bool = False) -> Figure:
    import plotly.graph_objects as go

    labels = result.labels()
    fig = go.Figure()
    for key, name in keys:
        for sub in result.sublayers:
            sel = [r for r in rows if r["sublayer"] == sub]
            y = [None if r.get(key) is None else r[key] + shift for r in sel]
            if all(v is None for v in y):
                continue
            err = None
            if f"{key}_ci_high" in sel[0]:
                err = dict(type="data", symmetric=False,
                           array=[_sub(r.get(f"{key}_ci_high"), r.get(key)) for r in sel],
                           arrayminus=[_sub(r.get(key), r.get(f"{key}_ci_low")) for r in sel])
            where = f"post-{'attention' if sub == 'attn' else 'MLP'}"
            fig.add_trace(go.Scatter(
                x=[r["label"] for r in sel], y=y, mode="lines+markers", error_y=err,
                name=f"{name} ({where})" if name else where, line=dict(dash="solid" if sub == "mlp" else "dot"),
            ))
    fig.update_layout(title=title, height=380, margin=dict(l=70, r=20, t=50, b=60), yaxis_title=yaxis,
                      xaxis=dict(type="category", categoryorder="array", categoryarray=labels,
                                 title="block, sub-layer (0-indexed)"))
    if log:
        fig.update_yaxes(type="log")
    elif fraction:
        fig.update_yaxes(range=[-0.02, 1.02])
    return fig


def metric_figure(result: LensFigureData, metric: str, *, rows: Sequence[JsonMapping] | None = None,
                  n_boot: int = 1000, seed: int = 0) -> Figure:
    """The line chart of one metric over depth (mean over prompts, 95% bootstrap interval); the rank on a log
    axis (plotted as rank + 1), the fractions on [0, 1]."""
    rows = json_ready(result.rows(n_boot=n_boot, seed=seed)) if rows is None else rows
    rank = metric == "answer_rank"
    title = ("Rank of the correct answer + 1 (1 = top-1, log scale)" if rank else TITLES[metric])
    return _line_chart(result, rows, title + " (mean over prompts, 95% bootstrap interval)", [(metric, "")],
                       YLABELS[metric], shift=1.0 if rank else 0.0, log=rank, fraction=metric in FRACTIONS)


def rank_heatmap(result: LensFigureData) -> Figure:
    """The rank of the answer per sub-layer and prompt (log colour scale), the first
    :data:`MAX_HEATMAP_PROMPTS` prompts; labelled per prompt up to :data:`MAX_LABELLED_ROWS` of them."""
    import plotly.graph_objects as go

    labels = result.labels()
    n = min(result.n_prompts, MAX_HEATMAP_PROMPTS)
    rank = result.flat("answer_rank")[:n]
    # The colour is log10(rank + 1); the colour bar is labelled in ranks (0 = top-1, 9 = tenth, ...).
    top = max(1.0, float(np.nanmax(rank)) if rank.size else 1.0)
    ticks = [r for r in (0, 1, 9, 99, 999, 9999, 99999) if r <= max(top, 1)]
    fig = go.Figure(go.Heatmap(
        z=np.log10(rank + 1.0), x=labels, y=[f"{i}: {p}" for i, p in enumerate(result.prompts[:n])],
        customdata=rank, colorscale="Viridis_r",
        colorbar=dict(title="rank of the<br>answer (log)", tickvals=[float(np.log10(r + 1)) for r in ticks],
                      ticktext=["0 (top-1)" if r == 0 else str(r) for r in ticks]),
        hovertemplate="%{y}<br>%{x}<br>rank %{customdata}<extra></extra>",
    ))
    labelled = n <= MAX_LABELLED_ROWS
    fig.update_layout(title=f"Rank of the correct answer per sub-layer ({n} of {result.n_prompts} prompts; 0 = top-1)",
                      height=120 + HEATMAP_ROW_PX * min(n, MAX_LABELLED_ROWS) + 60,
                      margin=dict(l=160 if labelled else 60, r=20, t=50, b=60),
                      xaxis=dict(type="category", categoryorder="array", categoryarray=labels,
                                 title="block, sub-layer (0-indexed)"),
                      yaxis=dict(autorange="reversed", showticklabels=labelled,
                                 title="prompt" if labelled else f"prompt (0..{n - 1}; hover for the text)"))
    return fig


def tracked_figure(result: LensFigureData, rows: Sequence[JsonMapping]) -> Figure:
    """The share of prompts whose top-``k`` holds each tracked prompt token, over depth: the
    :data:`MAX_TRACKED_LINES` tokens of the highest share anywhere drawn one by one (in the order tracked), the
    others as one line of their mean share (a few-shot prompt tracks every token of its examples)."""
    names = list(result.tracked)
    peak = {t: max((float(r[f"visible_{t}"]) for r in rows if r.get(f"visible_{t}") is not None), default=0.0)
            for t in names}
    top = set(sorted(names, key=lambda t: -peak[t])[:MAX_TRACKED_LINES])
    shown, rest = [t for t in names if t in top], [t for t in names if t not in top]
    keys = [(f"visible_{t}", t) for t in shown]
    title = f"Tracked prompt tokens in the top-{result.top_k} (share of prompts)"
    if rest:
        def mean_rest(r: JsonMapping) -> float | None:
            vals = [float(r[f"visible_{t}"]) for t in rest if r.get(f"visible_{t}") is not None]
            return float(np.mean(vals)) if vals else None

        rows = [{**r, REST_KEY: mean_rest(r)} for r in rows]
        keys.append((REST_KEY, f"mean of the other {len(rest)}"))
        title += f": the {len(shown)} most visible of {len(names)} tracked tokens, the rest averaged"
    return _line_chart(result, rows, title, keys, "share of prompts", fraction=True)


def interchange_figure(interchanges: Sequence[InterchangeFigureData]) -> Figure:
    """The drop of the answer probability when one block's last-position attention output is patched."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in interchanges:
        rr = r.rows()
        fig.add_trace(go.Scatter(
            x=[f"L{x['layer']}" for x in rr], y=[x["drop"] for x in rr], mode="lines+markers",
            name=f"{r.label} (n={len(r.clean_prob)})",
            error_y=dict(type="data", symmetric=False, array=[x["drop_ci_high"] - x["drop"] for x in rr],
                         arrayminus=[x["drop"] - x["drop_ci_low"] for x in rr]),
        ))
    fig.update_layout(title="Interchange of the last-position attention output: drop of the answer probability",
                      height=380, margin=dict(l=70, r=20, t=50, b=60),
                      # From zero: the drops compare to no drop at all, not to each other only.
                      yaxis=dict(title="clean - patched P(answer)", rangemode="tozero", zeroline=True,
                                 zerolinecolor="#888"),
                      xaxis=dict(type="category", title="patched block (0-indexed)"))
    return fig


def figures(result: LensFigureData, interchanges: Sequence[InterchangeFigureData] = (), *,
            rows: Sequence[JsonMapping] | None = None, n_boot: int = 1000, seed: int = 0) -> list[Figure]:
    """Every figure of the report, in its order."""
    rows = json_ready(result.rows(n_boot=n_boot, seed=seed)) if rows is None else rows
    figs = [metric_figure(result, m, rows=rows) for m in METRICS]
    if result.tracked:
        figs.append(tracked_figure(result, rows))
    figs.append(rank_heatmap(result))
    if interchanges:
        figs.append(interchange_figure(interchanges))
    return figs


def _sub(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else float(a) - float(b)
