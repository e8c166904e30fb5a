"""Offline HTML report and JSON output of early decoding (:mod:`circuits.lens`).

The only part of the package that writes files; the analyses return results and never write.

``write_lens_outputs(out_dir, result, ...)`` writes ``lens.json`` (schema in ``docs/lens.md``), ``lens.npz``
(the per-prompt arrays :meth:`~circuits.lens.LensResult.load` reads back) and ``report.html``: one plotly line
chart per metric over depth (post-attention and post-MLP as separate traces on the ordered axis
``L0 attn, L0 mlp, L1 attn, ...``, 95% bootstrap intervals as error bars), the visibility of operands and
operators, a heatmap of the answer rank per sub-layer over prompts, and the interchange drops per block. The
page is built by the shared offline writer of :mod:`circuits.report` (plotly.js embedded once), so the file works
offline.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from circuits import files
from circuits.formats import describe_prompts
from circuits.report import write_page, write_text

from .interchange import InterchangeResult
from .result import METRICS, LensResult, json_ready

__all__ = ["TITLES", "MAX_HEATMAP_PROMPTS", "figures", "lens_json", "metric_figure", "write_lens_outputs"]

TITLES = {
    "answer_prob": "Probability of the correct answer",
    "answer_rank": "Rank of the correct answer (0 = top-1)",
    "numeric_mass": "Probability mass on numeric tokens",
    "top1_numeric": "Share of prompts whose top-1 token is numeric",
    "top10_numeric": "Share of numeric tokens among the top-10",
    "abs_error": "|top numeric prediction - answer|",
}
MAX_HEATMAP_PROMPTS = 200


def lens_json(
    result: LensResult,
    *,
    interchanges: Sequence[InterchangeResult] = (),
    meta: Mapping[str, Any] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The ``lens.json`` document: ``meta`` keys first, then :meth:`LensResult.to_dict` (``prompts``,
    ``rows``, settings) and ``interchange`` (label -> :meth:`InterchangeResult.to_dict`)."""
    doc: dict[str, Any] = dict(meta or {})
    doc["prompt_format"] = describe_prompts(doc)
    doc.update(result.to_dict(n_boot=n_boot, seed=seed))
    doc["interchange"] = {r.label or f"interchange{i}": r.to_dict() for i, r in enumerate(interchanges)}
    return json_ready(doc)


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


def _line_chart(result: LensResult, rows: Sequence[Mapping[str, Any]], title: str, keys: Sequence[tuple[str, str]],
                yaxis: str, *, shift: float = 0.0, log: bool = False, fraction: bool = False) -> Any:
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


def metric_figure(result: LensResult, metric: str, *, rows: Sequence[Mapping[str, Any]] | None = None,
                  n_boot: int = 1000, seed: int = 0) -> Any:
    """The line chart of one metric over depth (mean over prompts, 95% bootstrap interval); the rank on a log
    axis (plotted as rank + 1), the fractions on [0, 1]."""
    rows = json_ready(result.rows(n_boot=n_boot, seed=seed)) if rows is None else rows
    rank = metric == "answer_rank"
    title = ("Rank of the correct answer + 1 (1 = top-1, log scale)" if rank else TITLES[metric])
    return _line_chart(result, rows, title + " (mean over prompts, 95% bootstrap interval)", [(metric, "")],
                       YLABELS[metric], shift=1.0 if rank else 0.0, log=rank, fraction=metric in FRACTIONS)


def rank_heatmap(result: LensResult) -> Any:
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


def interchange_figure(interchanges: Sequence[InterchangeResult]) -> Any:
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


def figures(result: LensResult, interchanges: Sequence[InterchangeResult] = (), *,
            rows: Sequence[Mapping[str, Any]] | None = None, n_boot: int = 1000, seed: int = 0) -> list[Any]:
    """Every figure of the report, in its order."""
    rows = json_ready(result.rows(n_boot=n_boot, seed=seed)) if rows is None else rows
    figs = [metric_figure(result, m, rows=rows) for m in METRICS]
    if result.tracked:
        figs.append(_line_chart(result, rows, f"Tracked prompt tokens in the top-{result.top_k} (share of prompts)",
                                [(f"visible_{t}", t) for t in result.tracked], "share of prompts", fraction=True))
    figs.append(rank_heatmap(result))
    if interchanges:
        figs.append(interchange_figure(interchanges))
    return figs


def _figures(doc: Mapping[str, Any], result: LensResult, interchanges: Sequence[InterchangeResult]) -> list[Any]:
    return figures(result, interchanges, rows=doc["rows"])


def _sub(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else float(a) - float(b)


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """``arrays`` as a compressed ``.npz`` at ``path``, atomically (temporary file, then rename)."""
    import os

    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        # numpy's stub types **kwds together with its allow_pickle: bool keyword.
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def write_lens_outputs(
    out_dir: str | Path,
    result: LensResult,
    *,
    interchanges: Sequence[InterchangeResult] = (),
    meta: Mapping[str, Any] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Path, Path]:
    """Write ``lens.json`` and ``report.html`` into ``out_dir`` (created); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = lens_json(result, interchanges=interchanges, meta=meta, n_boot=n_boot, seed=seed)
    json_path = write_text(out / files.LENS, json.dumps(doc, indent=1))
    result.interchanges = list(interchanges)
    write_arrays(out / files.LENS_ARRAYS, result.array_dict())
    figs = _figures(doc, result, interchanges)
    notes = [" · ".join(f"{k}: {v}" for k, v in (meta or {}).items() if k not in ("numbers", "format")),
             f"Decoding: {result.decode}; {result.n_prompts} prompts; last position; post-attention and "
             f"post-MLP residual states of every block (0-indexed).",
             f"Prompts: {describe_prompts(meta or {})}."]
    html_path = write_page(out / files.REPORT, "Early decoding (logit lens)", figs, notes)
    return json_path, html_path
