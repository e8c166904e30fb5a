"""Outputs of ``af1 groundtruth``: the recovery table (``table.csv``, ``table.md``), ``summary.json``, one
SVG figure per model (faithfulness vs circuit size, one line per ablation; plain SVG so that
Markdown documents can show it) and ``report.html`` (the same curves as offline plotly figures)."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError, CorruptRunError
from circuits.report import write_page, write_text
from circuits.store import files
from circuits.store.atomic import safe_name
from interventions.types import DataFrame, Figure, JsonDict

if TYPE_CHECKING:
    from circuits.groundtruth.recovery import Recovery
    from circuits.prune.result import PruneResult
    from circuits.search.results import SearchResult

__all__ = ["COLUMNS", "GroundTruthResult", "table_rows", "table_markdown", "curve_svg", "write_outputs"]

COLUMNS = ("model", "task", "ablation", "planted", "selected", "config_recovered", "faithfulness_planted",
           "pruned_at", "planted_heads", "found_heads", "precision", "recall", "heads_recovered", "cpr", "cmd",
           "n_prompts")
COLORS = {"cama": "#1f77b4", "mean": "#ff7f0e", "zero": "#2ca02c"}


def _heads(heads: Sequence[tuple[int, int]] | None) -> str:
    return "none" if heads is None else " ".join(f"L{b}H{h}" for b, h in heads) or "(empty)"


def _config(c: tuple[int, int] | None) -> str:
    return "none" if c is None else f"({c[0]}, {c[1]})"


def table_rows(rows: Sequence[Recovery]) -> list[JsonDict]:
    """One flat dict per :class:`circuits.groundtruth.Recovery` with the :data:`COLUMNS` (configurations
    as ``"(wait, transfer)"``, head sets as ``"L3H0 L3H1"``, fractions rounded to 4 digits)."""
    out = []
    for r in rows:
        out.append({"model": r.model, "task": r.task, "ablation": r.ablation, "planted": _config(r.planted),
                    "selected": _config(r.selected), "config_recovered": r.config_recovered,
                    "faithfulness_planted": round(r.faithfulness_planted, 4), "pruned_at": _config(r.pruned_at),
                    "planted_heads": _heads(r.planted_heads), "found_heads": _heads(r.found_heads),
                    "precision": round(r.precision, 4), "recall": round(r.recall, 4),
                    "heads_recovered": r.heads_recovered, "cpr": round(r.cpr, 4), "cmd": round(r.cmd, 4),
                    "n_prompts": r.n_prompts})
    return out


def table_markdown(rows: Sequence[Recovery]) -> str:
    """The recovery table as Markdown (one line per model, task and ablation)."""
    head = ["model", "task", "ablation", "planted (w, t)", "selected", "faith. planted", "planted heads",
            "surviving heads", "P", "R", "CPR", "CMD"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in table_rows(rows):
        ok = " ✓" if d["config_recovered"] else " ✗"
        hk = " ✓" if d["heads_recovered"] else " ✗"
        lines.append(f"| {d['model']} | {d['task']} | {d['ablation']} | {d['planted']} | {d['selected']}{ok} | "
                     f"{d['faithfulness_planted']:.3f} | {d['planted_heads']} | {d['found_heads']}{hk} | "
                     f"{d['precision']:.2f} | {d['recall']:.2f} | {d['cpr']:.3f} | {d['cmd']:.3f} |")
    return "\n".join(lines) + "\n"


def curve_svg(rows: Sequence[Recovery], title: str, width: int = 480, height: int = 280) -> str:
    """An SVG line chart of the pruning curves of ``rows`` (same model and task, one line per ablation):
    x = circuit size, transfer heads kept / all transfer heads of the pruned configuration (0 .. 1, the
    axis of CPR and CMD), y = faithfulness (0 .. 1), the target as a dashed line."""
    left, right, top, bottom = 48, 170, 28, 40
    pw, ph = width - left - right, height - top - bottom

    def xy(x: float, f: float) -> str:
        return f"{left + pw * x:.1f},{top + ph * (1 - min(max(f, 0.0), 1.0)):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="16" font-size="12">{html.escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for v in (0, 0.5, 1):
        parts.append(f'<text x="{left - 6}" y="{top + ph * (1 - v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        parts.append(f'<text x="{left + pw * v:.1f}" y="{top + ph + 14}" text-anchor="middle">{v:g}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">transfer heads kept / all</text>')
    if rows:
        t = rows[0].target
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph * (1 - t):.1f}" y2="{top + ph * (1 - t):.1f}" '
                     f'stroke="#888" stroke-dasharray="4,3"/>')
    for i, r in enumerate(rows):
        color = COLORS.get(r.ablation, "#333")
        kmax = max(k for k, _ in r.curve) or 1
        pts = " ".join(xy(k / kmax, f) for k, f in r.curve)
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2" '
                     f'stroke-dasharray="{"" if i == 0 else f"{2 + 3 * i},{2 * i}"}"/>')
        parts.append(f'<text x="{left + pw + 8}" y="{top + 14 + 30 * i}" fill="{color}">{r.ablation}: CPR {r.cpr:.2f}, '
                     f'CMD {r.cmd:.2f}</text>')
        parts.append(f'<text x="{left + pw + 8}" y="{top + 27 + 30 * i}" fill="{color}">'
                     f'pruned at {_config(r.pruned_at)}, {kmax} heads</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _plotly_figure(rows: Sequence[Recovery], title: str) -> Figure:
    import plotly.graph_objects as go

    fig = go.Figure()
    for r in rows:
        kmax = max(k for k, _ in r.curve) or 1
        fig.add_trace(go.Scatter(x=[k / kmax for k, _ in r.curve], y=[f for _, f in r.curve], mode="lines+markers",
                                 name=f"{r.ablation} at {_config(r.pruned_at)}, {kmax} heads (CPR {r.cpr:.3f}, "
                                      f"CMD {r.cmd:.3f})",
                                 text=[f"{k} heads kept" for k, _ in r.curve]))
    if rows:
        fig.add_hline(y=rows[0].target, line_dash="dash", annotation_text=f"target {rows[0].target:g}")
    fig.update_layout(title=title, xaxis_title="transfer heads kept / all (circuit size)", yaxis_title="faithfulness",
                      yaxis_range=[-0.02, 1.02])
    return fig


def recovery_from_dict(d: JsonDict) -> Recovery:
    """A :class:`~circuits.groundtruth.Recovery` from its ``summary.json`` row (lists back to tuples)."""
    from dataclasses import fields

    from circuits.groundtruth.recovery import Recovery

    pair = lambda v: tuple(v) if v is not None else None  # noqa: E731
    heads = lambda v: [tuple(h) for h in v] if v is not None else None  # noqa: E731
    conv = {"planted": pair, "selected": pair, "pruned_at": pair, "planted_heads": heads, "found_heads": heads,
            "curve": lambda v: [(int(k), float(f)) for k, f in v]}
    names = {f.name for f in fields(Recovery)}
    return Recovery(**{k: conv.get(k, lambda v: v)(v) for k, v in d.items() if k in names})


class GroundTruthResult:
    """The recovery table of ``af1 groundtruth`` (:func:`circuits.groundtruth.run_recovery`), reopened from its
    ``--out`` directory (:meth:`load`): ``rows`` (one :class:`~circuits.groundtruth.Recovery` per model, task
    and ablation), with :meth:`to_pandas`, the report's curves (:meth:`plot`) and each row's own search and
    pruning runs (:meth:`search`, :meth:`prune`)."""

    def __init__(self, rows: Sequence[Recovery], out_dir: str | Path | None = None, meta: JsonDict | None = None):
        self.rows = list(rows)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.meta = dict(meta or {})

    @classmethod
    def load(cls, out_dir: str | Path) -> GroundTruthResult:
        """The rows of ``out_dir/summary.json`` (``FileNotFoundError`` while the command has not finished)."""
        path = Path(out_dir) / files.SUMMARY
        if not path.is_file():
            raise FileNotFoundError(f"{out_dir} holds no summary.json: not a finished af1 groundtruth directory")
        doc = json.loads(path.read_text())
        if not isinstance(doc.get("rows"), list):
            raise CorruptRunError(f"{path} has no recovery rows: not written by af1 groundtruth")
        return cls([recovery_from_dict(r) for r in doc["rows"]], out_dir,
                   {k: v for k, v in doc.items() if k != "rows"})

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame`` of the recovery table (:data:`COLUMNS`, as ``table.csv``)."""
        from circuits.store.frames import dataframe

        return dataframe(table_rows(self.rows), COLUMNS)

    def groups(self) -> dict[tuple[str, str], list[Recovery]]:
        out: dict[tuple[str, str], list[Recovery]] = {}
        for r in self.rows:
            out.setdefault((r.model, r.task), []).append(r)
        return out

    def plot(self, model: str | None = None, task: str | None = None) -> Figure:
        """The report's faithfulness-over-circuit-size curves of ``model`` and ``task`` (default: the first)."""
        groups = self.groups()
        key = next((k for k in groups if (model is None or k[0] == model) and (task is None or k[1] == task)), None)
        if key is None:
            raise KeyError(f"no rows for model={model!r}, task={task!r}; rows: {sorted(groups)}")
        return _plotly_figure(groups[key], f"{key[0]}, {key[1]}: faithfulness over circuit size")

    def figures(self) -> list[Figure]:
        """Every figure of the report."""
        return [_plotly_figure(g, f"{m}, {t}: faithfulness over circuit size") for (m, t), g in self.groups().items()]

    def _run(self, model: str, task: str, ablation: str, which: str) -> Path:
        if self.out_dir is None:
            raise ArgumentError("this result was not reopened from a directory: no run directories to open")
        return self.out_dir / files.RUNS_DIR / model / task / ablation / which

    def search(self, model: str, task: str = "add_sub", ablation: str = "cama") -> SearchResult:
        """The search of one row (:class:`~circuits.search.SearchResult`)."""
        from circuits.search.results import SearchResult

        return SearchResult.load(self._run(model, task, ablation, "search"))

    def prune(self, model: str, task: str = "add_sub", ablation: str = "cama") -> PruneResult:
        """The pruning run of one row (:class:`~circuits.prune.PruneResult`)."""
        from circuits.groundtruth.recovery import prune_folder
        from circuits.prune.result import PruneResult

        row = next((r for r in self.rows if (r.model, r.task, r.ablation) == (model, task, ablation)), None)
        which = prune_folder(row.planted, row.pruned_at) if row is not None else "prune"
        return PruneResult.load(self._run(model, task, ablation, which))


def write_outputs(rows: Sequence[Recovery], out_dir: str | Path, meta: JsonDict | None = None) -> dict[str, Path]:
    """Write ``table.csv``, ``table.md``, ``summary.json``, ``figures/<model>-<task>.svg`` and
    ``report.html`` to ``out_dir``; returns their paths by name."""
    out = Path(out_dir)
    flat = table_rows(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS))
    writer.writeheader()
    writer.writerows(flat)
    paths = {"csv": write_text(out / files.TABLE_CSV, buf.getvalue()),
             "md": write_text(out / files.TABLE_MD, table_markdown(rows)),
             "summary": write_text(out / files.SUMMARY, json.dumps(
                 {**(meta or {}), "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")}
    groups: dict[tuple[str, str], list[Recovery]] = {}
    for r in rows:
        groups.setdefault((r.model, r.task), []).append(r)
    figures = []
    for (model, task), group in groups.items():
        title = f"{model}, {task}: faithfulness over circuit size"
        svg = safe_name(f"{model}-{task}.svg", "figure of model and task")
        paths[f"svg:{model}:{task}"] = write_text(out / files.FIGURES_DIR / svg, curve_svg(group, title))
        figures.append(_plotly_figure(group, title))
    notes = [f"{sum(r.config_recovered for r in rows)}/{len(rows)} rows recover the planted (wait, transfer); "
             f"{sum(r.heads_recovered for r in rows)}/{len(rows)} the planted head set exactly.",
             "CPR: area under faithfulness over circuit size (heads kept / transfer heads), higher is better; "
             "CMD: area between the curve and 1, lower is better."]
    paths["html"] = write_page(out / files.REPORT, "Recovery of planted AF1 structures", figures, notes)
    return paths
