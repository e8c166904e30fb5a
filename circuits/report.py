"""Plotly figures of the AF1 search and the necessity sweep, written as offline HTML reports.

Reports open without a network. By default (:data:`PLOTLYJS` ``"directory"``) the reports of one output
directory share one ``plotly.min.js`` written next to the first of them (or found in a directory above,
e.g. a sweep's root for its cells' reports) instead of embedding its 4.8 MB each; ``AF1_PLOTLYJS=embed``
embeds it in every page as before, ``AF1_PLOTLYJS=cdn`` links the CDN copy (needs a network). Figures: the
faithfulness heatmap over ``wait`` x ``transfer`` with the selected configuration marked, and a bar chart of
faithfulness per block.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from circuits.errors import ArgumentError
from circuits.store import files
from interventions.types import Figure

PLOTLYJS_FILE = "plotly.min.js"
PLOTLYJS_MODES = ("directory", "embed", "cdn")
PLOTLYJS = "directory"
"""How reports get plotly.js (overridden by the ``AF1_PLOTLYJS`` environment variable): ``"directory"`` (one
shared ``plotly.min.js`` next to them), ``"embed"`` (in every page) or ``"cdn"`` (a link, needs a network)."""
SHARED_LEVELS = 6
"""Directories above a report searched for a shared ``plotly.min.js`` (a sweep cell's report is two below the
sweep's, a ground-truth run five below its table); only an af1 directory counts: one holding ``run.json``, or
the report lies under its ``cells/`` or ``runs/``."""


def plotlyjs_mode() -> str:
    import os

    mode = os.environ.get("AF1_PLOTLYJS", PLOTLYJS).strip().lower()
    if mode not in PLOTLYJS_MODES:
        raise ArgumentError(f"AF1_PLOTLYJS={mode!r} is not valid: choose one of {', '.join(PLOTLYJS_MODES)}")
    return mode


def ensure_plotlyjs(folder: str | Path) -> Path:
    """``folder/plotly.min.js`` (written once, atomically; rewritten if it holds another plotly.js), so that
    the reports under ``folder`` share it."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLYJS_FILE
    text = get_plotlyjs()
    if not path.is_file() or path.stat().st_size != len(text.encode()):
        write_text(path, text)
    return path


def shared_plotlyjs(report: Path) -> str:
    """The relative ``src`` of the ``plotly.min.js`` the report at ``report`` uses: the nearest one in its
    folder or up to :data:`SHARED_LEVELS` folders above, else one written next to it."""
    import os

    from plotly.offline import get_plotlyjs

    size = len(get_plotlyjs().encode())
    folder = report.parent
    for up in [folder, *list(folder.parents)[:SHARED_LEVELS]]:
        candidate = up / PLOTLYJS_FILE
        # Above its own folder only an af1 directory that holds others (a sweep, a ground-truth table): a
        # report must not depend on an unrelated file that happens to sit higher up.
        below = folder.relative_to(up).parts
        ours = not below or (up / files.IDENTITY).is_file() or below[0] in (files.CELLS_DIR, files.RUNS_DIR)
        if ours and candidate.is_file() and candidate.stat().st_size == size:
            return Path(os.path.relpath(candidate, folder)).as_posix()
    ensure_plotlyjs(folder)
    return PLOTLYJS_FILE


def write_page(path: str | Path, title: str, figures: Sequence[Figure], notes: Sequence[str] = (),
               links: Sequence[tuple[str, str]] = ()) -> Path:
    """Write the report :func:`page` at ``path``, getting plotly.js as :func:`plotlyjs_mode` says."""
    path = Path(path)
    mode = plotlyjs_mode()
    src = None if mode == "embed" else "cdn" if mode == "cdn" else shared_plotlyjs(path)
    return write_text(path, page(title, figures, notes, links, plotlyjs=src))


def page(title: str, figures: Sequence[Figure], notes: Sequence[str] = (), links: Sequence[tuple[str, str]] = (),
         plotlyjs: str | None = None) -> str:
    """An HTML page holding ``figures``; ``notes`` are paragraphs of text, ``links`` ``(label, relative href)``
    pairs listed after them. ``plotlyjs``: ``None`` embeds plotly.js once (a self-contained page that opens
    offline), ``"cdn"`` links the CDN copy, anything else is the ``src`` of a shared file (e.g.
    ``"plotly.min.js"``, see :func:`write_page`)."""
    parts = []
    head = ""
    if plotlyjs is not None and plotlyjs != "cdn":
        head = f"<script src='{html.escape(plotlyjs)}'></script>"
    for i, fig in enumerate(figures):
        include: bool | str = (i == 0) if plotlyjs is None else ("cdn" if plotlyjs == "cdn" and i == 0 else False)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=include, div_id=f"fig{i}"))
    body = "\n".join(f"<p>{html.escape(n)}</p>" for n in notes)
    if links:
        items = "".join(f'<li><a href="{html.escape(href)}">{html.escape(label)}</a></li>' for label, href in links)
        body += f"\n<ul>{items}</ul>"
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>{head}</head>\n<body style='font-family:sans-serif'>\n"
        f"<h2>{html.escape(title)}</h2>\n{body}\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`circuits.store.atomic.write_text`: an exclusively created
    temporary file of unpredictable name beside it, then rename; a link at ``path`` is refused)."""
    from circuits.store import atomic

    return atomic.write_text(path, text)


def search_heatmap(result: Any, title: str = "AF1 search") -> Figure:
    """Heatmap of faithfulness (rows: ``wait`` -1..n_layers-1, columns: ``transfer`` 0..n_layers);
    blank cells are configurations that do not exist or were not evaluated; the selection is boxed."""
    import plotly.graph_objects as go

    n = result.n_layers
    waits = list(range(-1, n))
    transfers = list(range(0, n + 1))
    z: list[list[float | None]] = [[None] * len(transfers) for _ in waits]
    text: list[list[str]] = [[""] * len(transfers) for _ in waits]
    hover: list[list[str]] = [["not a configuration" if t > n - 1 - w else "not evaluated" for t in transfers]
                              for w in waits]
    for r in result.results:
        z[r.wait + 1][r.transfer] = r.faithfulness
        text[r.wait + 1][r.transfer] = f"{r.faithfulness:.2f}"
        ci = "" if any(math.isnan(v) for v in (r.ci_low, r.ci_high)) else f" [{r.ci_low:.3f}, {r.ci_high:.3f}]"
        hover[r.wait + 1][r.transfer] = (
            f"wait {r.wait}, transfer {r.transfer}<br>faithfulness {r.faithfulness:.3f}{ci}<br>"
            f"{r.n_faithful}/{r.n} prompts, answer prob {r.mean_answer_prob:.3f}"
        )
    fig = go.Figure(
        go.Heatmap(
            z=z, x=transfers, y=waits, text=text, texttemplate="%{text}", customdata=hover,
            hovertemplate="%{customdata}<extra></extra>", zmin=0.0, zmax=1.0, colorscale="Viridis",
            colorbar=dict(title="faithfulness"), name="faithfulness",
        )
    )
    # The selection (or, when nothing is sufficient, the most faithful configuration) is outlined, not marked
    # on top of its value; the legend names it.
    best = max(result.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer), default=None)
    mark = result.selected if result.selected is not None else best
    if mark is not None:
        chosen = result.selected is not None
        line = dict(color="red", width=4) if chosen else dict(color="red", width=3, dash="dot")
        fig.add_shape(type="rect", x0=mark.transfer - 0.5, x1=mark.transfer + 0.5, y0=mark.wait - 0.5,
                      y1=mark.wait + 0.5, line=line)
        label = (f"selected: wait {mark.wait}, transfer {mark.transfer}" if chosen else
                 f"most faithful (below the threshold): wait {mark.wait}, transfer {mark.transfer}")
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, showlegend=True,
                                 marker=dict(symbol="square-open", size=16, color="red", line=dict(width=3))))
    if result.selected is not None:
        s = result.selected
        sub = f"selected wait={s.wait}, transfer={s.transfer} (faithfulness {s.faithfulness:.3f})"
    else:
        sub = f"no configuration reaches faithfulness {result.threshold:g}"
    skipped = sum(t <= n - 1 - w for w in waits for t in transfers) - len(result.results)
    blank = "blank: not a configuration" + (f" or not evaluated ({skipped}, skipped by the {result.grid} grid)"
                                            if skipped > 0 else "")
    fig.update_layout(
        title=f"{title}<br><sup>{sub}; threshold {result.threshold:g}, {result.grid} grid<br>{blank}</sup>",
        xaxis=dict(title="transfer (blocks after wait where the last token reads the context)", dtick=1,
                   showgrid=False, zeroline=False),
        yaxis=dict(title="wait (last block before the ablation; -1 = none)", dtick=1, showgrid=False, zeroline=False),
        plot_bgcolor="white", legend=dict(orientation="h", x=0, y=-0.16, xanchor="left", yanchor="top"),
        margin=dict(t=110), width=760, height=680,
    )
    return fig


def smallest_transfer_figure(result: Any) -> Figure:
    """Per wait: the smallest sufficient transfer (missing bar: none or not evaluated)."""
    import plotly.graph_objects as go

    waits = sorted(result.smallest_transfer)
    ys = [result.smallest_transfer[w] if isinstance(result.smallest_transfer[w], int) else None for w in waits]
    labels = [str(result.smallest_transfer[w]) if result.smallest_transfer[w] is not None else "none" for w in waits]
    fig = go.Figure(go.Bar(x=waits, y=ys, text=labels, textposition="outside", name="smallest transfer"))
    fig.update_layout(title=f"Smallest sufficient transfer per wait (faithfulness >= {result.threshold:g})",
                      xaxis=dict(title="wait (last block before the ablation)", dtick=1),
                      yaxis=dict(title="smallest sufficient transfer (blocks)", dtick=1, rangemode="tozero"),
                      width=760, height=400)
    if not any(isinstance(y, int) for y in ys):
        fig.add_annotation(text=f"no wait has a sufficient transfer: nothing reaches faithfulness {result.threshold:g}",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14))
        fig.update_yaxes(range=[0, max(1, result.n_layers)])
    return fig


def search_report(result: Any, path: str | Path, title: str = "AF1 search", notes: Sequence[str] = ()) -> Path:
    """Write the search report (heatmap + smallest transfer per wait) to ``path`` (self-contained HTML);
    ``notes``: lines after the summary (e.g. the fit set of the means)."""
    notes = [
        result.summary_line(),
        f"{len(result.results)} configurations evaluated ({result.grid} grid, {result.ablation} ablation, "
        f"{result.method} method), {result.n_prompts} prompts, base accuracy {result.base_accuracy:.1%}, "
        f"{result.seconds:.1f} s.",
        *notes,
    ]
    return write_page(path, title, [search_heatmap(result, title), smallest_transfer_figure(result)], notes)


def necessity_figure(layers: Sequence[int], faith: Sequence[float], ci: Sequence[tuple[float, float]] | None = None,
                     title: str = "Necessity sweep") -> Figure:
    """Bar chart: faithfulness when the last token cannot read earlier tokens in one block."""
    import plotly.graph_objects as go

    error_y = None
    if ci is not None:
        error_y = dict(type="data", symmetric=False, array=[hi - f for f, (_, hi) in zip(faith, ci)],
                       arrayminus=[f - lo for f, (lo, _) in zip(faith, ci)])
    fig = go.Figure(go.Bar(x=list(layers), y=list(faith), error_y=error_y, name="faithfulness"))
    # The values above the interval's top (or the bar), where the error bars do not hide them.
    tops = [hi if ci is not None and not math.isnan(hi) else f
            for f, (_, hi) in zip(faith, ci or [(0, math.nan)] * len(faith))]
    for x, f, top in zip(layers, faith, tops):
        fig.add_annotation(x=x, y=min(top, 1.0) + 0.02, text=f"{f:.2f}", showarrow=False, yanchor="bottom")
    fig.update_layout(title=title, xaxis=dict(title="block where the last token self-peeks", dtick=1),
                      yaxis=dict(title="faithfulness", range=[0, 1.12]), width=760, height=450)
    return fig


def necessity_report(layers: Sequence[int], faith: Sequence[float], path: str | Path,
                     ci: Sequence[tuple[float, float]] | None = None, title: str = "Necessity sweep",
                     notes: Sequence[str] = ()) -> Path:
    return write_page(path, title, [necessity_figure(layers, faith, ci, title)], notes)
