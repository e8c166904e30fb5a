"""The sweep's outputs: ``table.csv`` (one row per cell), ``table.md`` (min/avg/max over seeds) and
``report.html`` (a heatmap per model, links to every cell's own report)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from circuits.store import files
from circuits.sweep.config import SweepConfig
from circuits.sweep.rows import CellResult
from interventions.types import Figure

COLUMNS = ("model", "task", "ablation", "seed", "status", "base_accuracy", "n_prompts", "selected", "wait",
           "transfer", "faithfulness", "ci_low", "ci_high", "error", "path", "prompt_format")
"""The columns of ``table.csv``; ``prompt_format`` (the sweep's ``numbers``, ``shots`` and ``chat`` with the
row's task file's prefix and answer format: :func:`circuits.tasks.formats.describe_prompts`)."""


def fmt(x: object, digits: int = 3) -> str:
    if x is None:
        return ""
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def prompt_format(config: SweepConfig, task: str | None = None) -> str:
    """How the sweep's prompts of ``task`` are presented (:func:`circuits.tasks.formats.describe_prompts`; without a
    task: the sweep's ``numbers``, ``shots`` and ``chat`` alone)."""
    from circuits.tasks.formats import describe_prompts

    return describe_prompts({"numbers": config.numbers, "format": {"shots": config.shots, "chat": config.chat}},
                            task=task)


def prompt_formats(config: SweepConfig) -> str:
    """The prompt format of every task of the sweep: one description where they agree, else one per task."""
    shown = {t: prompt_format(config, t) for t in config.tasks}
    if len(set(shown.values())) <= 1:
        return next(iter(shown.values()), prompt_format(config))
    return "; ".join(f"{t}: {d}" for t, d in shown.items())


def csv_text(rows: Sequence[CellResult], config: SweepConfig | None = None) -> str:
    """One line per cell, the columns :data:`COLUMNS` (empty where a value does not apply; ``prompt_format``
    needs ``config``)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        d = {"prompt_format": prompt_format(config, r.task) if config is not None else None, **r.to_dict()}
        writer.writerow([fmt(d[c], 6) for c in COLUMNS])
    return buf.getvalue()


def groups(rows: Sequence[CellResult]) -> dict[tuple[str, str, str], list[CellResult]]:
    """Rows grouped by (model, task, ablation), seeds together, in the order of the sweep."""
    out: dict[tuple[str, str, str], list[CellResult]] = {}
    for r in rows:
        out.setdefault((r.model, r.task, r.ablation), []).append(r)
    return out


def label(config: SweepConfig, rows: Sequence[CellResult]) -> str:
    """What the rows' ``wait``/``transfer`` mean, over the seeds: the selections (search), the fixed
    configuration, or the most necessary block (necessity). Seeds where nothing reaches the threshold
    show ``none`` and, after ``most faithful``, the configuration whose faithfulness the row shows."""
    if not rows:
        return "-"
    if rows[0].ablation == "necessity":
        return ", ".join(sorted({f"block {r.wait}" for r in rows}))
    if rows[0].ablation == "lens":
        return "-"
    pairs = lambda rs: ", ".join(sorted({f"({r.wait}, {r.transfer})" for r in rs}))  # noqa: E731
    chosen = [r for r in rows if config.mode == "fixed" or r.selected]
    other = [r for r in rows if r not in chosen and r.transfer is not None]
    parts = [pairs(chosen)] if chosen else []
    if other:
        parts.append(f"none{f' ({len(other)} of {len(rows)} seeds)' if chosen else ''}; most faithful {pairs(other)}")
    return "; ".join(parts)


def markdown(config: SweepConfig, rows: Sequence[CellResult]) -> str:
    """The aggregated table: per (model, task, ablation), faithfulness min / avg / max over the seeds, the
    95% interval of each seed's value averaged, base accuracy and the (wait, transfer) per seed."""
    what = (f"faithfulness at wait={config.wait}, transfer={config.transfer}" if config.mode == "fixed"
            else f"faithfulness of the selected configuration (threshold {config.threshold:g})")
    lines = [f"Sweep: {what}; {len(config.seeds)} seed(s) ({', '.join(map(str, config.seeds))}), "
             f"{config.n_prompts} prompts per cell; prompts: {prompt_formats(config)}.", "",
             "| model | task | ablation | base acc. | faithfulness min / avg / max | 95% CI (avg) "
             "| (wait, transfer) | failed |",
             "|---|---|---|---|---|---|---|---|"]
    for (model, task, ablation), rs in groups(rows).items():
        ok = [r for r in rs if r.status == "ok"]
        vals = [r.faithfulness for r in ok if r.faithfulness is not None]
        faith = f"{min(vals):.3f} / {np.mean(vals):.3f} / {max(vals):.3f}" if vals else "-"
        lo = [r.ci_low for r in ok if r.ci_low is not None]
        hi = [r.ci_high for r in ok if r.ci_high is not None]
        ci = f"[{np.mean(lo):.3f}, {np.mean(hi):.3f}]" if lo and hi else "-"
        acc = f"{np.mean([r.base_accuracy for r in ok]):.3f}" if ok else "-"
        sel = label(config, ok)
        failed = "; ".join(f"seed {r.seed}: {r.error}" for r in rs if r.status != "ok")
        lines.append(f"| {model} | {task} | {ablation} | {acc} | {faith} | {ci} | {sel} | {failed} |")
    return "\n".join(lines) + "\n"


ROW_PX = 44
"""Height of a task's row in a sweep heatmap while it has up to 20 tasks (pixels); beyond, the rows shrink to
half that, then the figure stops growing at :data:`MAX_HEIGHT` (hover names every row)."""
MAX_HEIGHT = 1400


def heatmap_height(n_tasks: int) -> int:
    """The height of a heatmap of ``n_tasks`` rows (pixels): 200 for the title and axes, :data:`ROW_PX` per row
    up to 20 rows, then 880 px shared by the rows down to half of that per row, at most :data:`MAX_HEIGHT`."""
    row = max(ROW_PX / 2, min(ROW_PX, 20 * ROW_PX / max(n_tasks, 1)))
    return int(min(MAX_HEIGHT, max(320, 200 + row * n_tasks)))


def tile_text(value: float | None, rows: Sequence[CellResult]) -> str:
    """A heatmap tile's text: the faithfulness to two decimals and, where ``rows`` (the tile's seeds) carry a 95%
    bootstrap interval, the interval's bounds averaged over them (as ``table.md``) on a second line."""
    if value is None:
        return ""
    lo = [r.ci_low for r in rows if r.ci_low is not None]
    hi = [r.ci_high for r in rows if r.ci_high is not None]
    return f"{value:.2f}<br>[{np.mean(lo):.2f}, {np.mean(hi):.2f}]" if lo and hi else f"{value:.2f}"


def heatmap(config: SweepConfig, model: str, rows: Sequence[CellResult], ablation: str | None = None) -> Figure:
    """Per model: tasks x waits (search: best faithfulness at each wait, averaged over seeds, of one
    ``ablation``: never averaged across ablations) or tasks x ablations (fixed: the configuration's
    faithfulness averaged over seeds, each tile with its 95% interval, so a one-cell sweep shows one). Its height
    follows the number of tasks."""
    import plotly.graph_objects as go

    mine = [r for r in rows if r.model == model and r.status == "ok" and r.ablation in config.ablations]
    if config.mode != "fixed":
        ablation = ablation if ablation is not None else next((r.ablation for r in mine), None)
        mine = [r for r in mine if r.ablation == ablation]
    tasks = list(dict.fromkeys(r.task for r in mine))
    if config.mode == "fixed":
        cols = list(dict.fromkeys(r.ablation for r in mine))
        value = lambda rs, c: [r.faithfulness for r in rs if r.ablation == c]  # noqa: E731
        xtitle = "ablation"
        title = f"{model}: faithfulness at wait={config.wait}, transfer={config.transfer}"
    else:
        cols = sorted({w for r in mine for w in r.faith_by_wait}, key=int, reverse=True)
        value = lambda rs, c: [r.faith_by_wait[c] for r in rs if c in r.faith_by_wait]  # noqa: E731
        xtitle = "wait (last block before the ablation; each cell: the best faithfulness over its transfers)"
        title = f"{model}, {ablation} ablation: best faithfulness per wait"
    z = [[float(np.mean(v)) if (v := value([r for r in mine if r.task == t], c)) else None for c in cols]
         for t in tasks]
    text = [[tile_text(zv, [r for r in mine if r.task == t and r.ablation == c] if config.mode == "fixed" else [])
             for zv, c in zip(zs, cols)] for zs, t in zip(z, tasks)]
    n_seeds = len(config.seeds)
    fig = go.Figure(go.Heatmap(z=z, x=[str(c) for c in cols], y=tasks, zmin=0, zmax=1, colorscale="Viridis",
                               text=text, texttemplate="%{text}", colorbar={"title": "faithfulness"}))
    if config.mode == "fixed":
        title += " (each tile: its 95% interval below" + (", averaged over the seeds)" if n_seeds > 1 else ")")
    fig.update_layout(title=title + (f" (mean of {n_seeds} seeds)" if n_seeds > 1 else ""), xaxis_title=xtitle,
                      yaxis_title="task", height=heatmap_height(len(tasks)),
                      xaxis=dict(type="category"), yaxis=dict(type="category", autorange="reversed"))
    if not tasks:
        fig.add_annotation(text="no finished cell", showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    return fig


def figures(config: SweepConfig, rows: Sequence[CellResult]) -> list[Figure]:
    """The report's heatmaps: per model, one per ablation (search) or one over the ablations (fixed)."""
    out = []
    for m in config.models:
        if config.mode == "fixed":
            out.append(heatmap(config, m, rows))
            continue
        for a in config.ablations:
            out.append(heatmap(config, m, rows, a))
    return out


def write_outputs(config: SweepConfig, rows: Sequence[CellResult], out: Path, *, seconds: float) -> None:
    """``table.csv``, ``table.md``, ``summary.json`` and ``report.html`` of the sweep in ``out``."""
    from circuits import report
    from circuits.store.runs import write_json

    report.write_text(out / files.TABLE_CSV, csv_text(rows, config))
    md = markdown(config, rows)
    report.write_text(out / files.TABLE_MD, md)
    settings = {**config.identity(), "threshold": config.threshold}  # the threshold only selects: not identity
    write_json(out / files.SUMMARY, {"config": settings, "seconds": seconds, "n_cells": len(rows),
                                     "n_failed": sum(r.status != "ok" for r in rows),
                                     "cells": [r.to_dict() for r in rows]})
    links = [(f"{r.model} / {r.task} / {r.ablation} / seed {r.seed}", (Path(r.path) / files.REPORT).as_posix())
             for r in rows if (out / r.path / files.REPORT).exists()]
    cells = ("the reports of the cells:" if links else
             "no cell has a report of its own (the cells of a fixed configuration write none).")
    notes = [f"{len(rows)} cells in {seconds:.0f} s; table.csv has one row per cell, table.md the aggregate; {cells}"]
    report.write_page(out / files.REPORT, "AF1 sweep", figures(config, rows), notes=notes, links=links)
