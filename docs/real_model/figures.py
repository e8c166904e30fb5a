"""Static figures and tables of the SmolLM2-135M runs in this folder, for the README and docs/real_models.md.

Reads the committed outputs (``search-<ablation>/grid.jsonl`` (each configuration of the search, without its
per-prompt outcomes) and ``summary.json``, ``necessity.json``, ``lens.json``, ``prune/curve.jsonl`` (the pruning
curve, without the candidates' estimates) and ``prune/summary.json``) and writes ``grid.svg`` (faithfulness of
every configuration, one heatmap per ablation), ``necessity.svg``, ``lens.svg``, ``prune.svg`` and ``tables.md``
(the best configuration per wait, the necessity, early-decoding and pruning rows). Standard library only:
``python docs/real_model/figures.py``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ABLATIONS = ("cama", "mean", "zero")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def colour(f: float) -> str:
    """White (0) to dark blue (1)."""
    f = min(max(f, 0.0), 1.0)
    r, g, b = (int(255 - (255 - c) * f) for c in (8, 48, 107))
    return f"#{r:02x}{g:02x}{b:02x}"


def svg(width: int, height: int, parts: list[str]) -> str:
    return "\n".join([f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                      f'font-family="sans-serif" font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>',
                      *parts, "</svg>"]) + "\n"


def grid_svg(grids: dict[str, list[dict]], n_layers: int) -> str:
    """One heatmap per ablation: x = wait (-1 .. n_layers-1), y = transfer (0 .. n_layers-1-wait), colour =
    faithfulness; the most faithful configuration outlined."""
    cell, left, top, gap = 9, 40, 34, 40
    pw, ph = (n_layers + 1) * cell, n_layers * cell
    width = left + len(grids) * (pw + gap)
    height = top + ph + 44
    parts = []
    for i, (name, rows) in enumerate(grids.items()):
        x0 = left + i * (pw + gap)
        best = max(rows, key=lambda r: (r["faithfulness"], r["wait"], -r["transfer"]))
        parts.append(f'<text x="{x0}" y="14" font-size="12">{html.escape(name)}: max {best["faithfulness"]:.3f} at '
                     f'({best["wait"]}, {best["transfer"]})</text>')
        for r in rows:
            x = x0 + (r["wait"] + 1) * cell
            y = top + (n_layers - 1 - r["transfer"]) * cell
            parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{colour(r["faithfulness"])}">'
                         f'<title>wait {r["wait"]}, transfer {r["transfer"]}: {r["faithfulness"]:.3f}</title></rect>')
        x = x0 + (best["wait"] + 1) * cell
        y = top + (n_layers - 1 - best["transfer"]) * cell
        parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="none" stroke="#d62728" stroke-width="2"/>')
        parts.append(f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        for w in (-1, 9, 19, n_layers - 1):
            parts.append(f'<text x="{x0 + (w + 1.5) * cell:.1f}" y="{top + ph + 14}" text-anchor="middle">{w}</text>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{top + ph + 30}" text-anchor="middle">wait</text>')
        for t in (0, 10, 20, n_layers - 1):
            parts.append(f'<text x="{x0 - 4}" y="{top + (n_layers - 0.5 - t) * cell + 4:.1f}" text-anchor="end">{t}</text>')
    parts.append(f'<text x="{left - 30}" y="{top - 6}">transfer</text>')
    lx = width - 150
    for j, v in enumerate((0, 0.25, 0.5, 0.75, 1)):
        parts.append(f'<rect x="{lx + 26 * j}" y="{height - 16}" width="26" height="10" fill="{colour(v)}" stroke="#999"/>')
        parts.append(f'<text x="{lx + 26 * j + 13}" y="{height - 20}" text-anchor="middle">{v:g}</text>')
    return svg(width, height, parts)


def bars_svg(values: list[tuple[int, float, float, float]], title: str, xlabel: str) -> str:
    """Bars with 95% intervals: ``(x, value, low, high)`` per bar, values in [0, 1]."""
    left, top, bottom, bw = 40, 28, 36, 14
    pw, ph = len(values) * bw, 180
    parts = [f'<text x="{left}" y="16" font-size="12">{html.escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for v in (0, 0.5, 1):
        y = top + ph * (1 - v)
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    for i, (x, f, lo, hi) in enumerate(values):
        cx = left + i * bw
        parts.append(f'<rect x="{cx + 2}" y="{top + ph * (1 - f):.1f}" width="{bw - 4}" height="{ph * f:.1f}" '
                     f'fill="#1f77b4"><title>{x}: {f:.3f} [{lo:.3f}, {hi:.3f}]</title></rect>')
        parts.append(f'<line x1="{cx + bw / 2}" x2="{cx + bw / 2}" y1="{top + ph * (1 - hi):.1f}" '
                     f'y2="{top + ph * (1 - lo):.1f}" stroke="#333"/>')
        if x % 5 == 0 or i == len(values) - 1:
            parts.append(f'<text x="{cx + bw / 2}" y="{top + ph + 13}" text-anchor="middle">{x}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{top + ph + 30}" text-anchor="middle">{html.escape(xlabel)}</text>')
    return svg(left + pw + 20, top + ph + bottom + 4, parts)


def lines_svg(labels: list[str], series: dict[str, list[float]], title: str) -> str:
    """Lines over sub-layers (values in [0, 1]), one per series."""
    left, top, right, bottom, dx = 40, 28, 150, 40, 7
    pw, ph = (len(labels) - 1) * dx, 180
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")
    parts = [f'<text x="{left}" y="16" font-size="12">{html.escape(title)}</text>',
             f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    for v in (0, 0.5, 1):
        parts.append(f'<text x="{left - 4}" y="{top + ph * (1 - v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for i, label in enumerate(labels):
        if i % 10 == 0 or i == len(labels) - 1:
            parts.append(f'<text x="{left + i * dx}" y="{top + ph + 13}" text-anchor="middle">{html.escape(label)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{top + ph + 30}" text-anchor="middle">block and sub-layer '
                 f'(attention, then MLP)</text>')
    for j, (name, ys) in enumerate(series.items()):
        pts = " ".join(f"{left + i * dx:.1f},{top + ph * (1 - min(max(y, 0.0), 1.0)):.1f}" for i, y in enumerate(ys))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{colours[j % 4]}" stroke-width="2"/>')
        parts.append(f'<text x="{left + pw + 8}" y="{top + 14 + 16 * j}" fill="{colours[j % 4]}">{html.escape(name)}</text>')
    return svg(left + pw + right, top + ph + bottom, parts)


def main() -> None:
    lines: list[str] = []
    grids = {a: read_jsonl(HERE / f"search-{a}" / "grid.jsonl") for a in ABLATIONS
             if (HERE / f"search-{a}" / "grid.jsonl").is_file()}
    if grids:
        n_layers = max(r["wait"] for rows in grids.values() for r in rows) + 1
        (HERE / "grid.svg").write_text(grid_svg(grids, n_layers))
        lines += ["Best configuration per wait (faithfulness, its transfer; ties: the smallest transfer):", "",
                  "| wait | " + " | ".join(grids) + " |", "|---|" + "---|" * len(grids)]
        for w in range(-1, n_layers):
            cells = []
            for rows in grids.values():
                mine = [r for r in rows if r["wait"] == w]
                b = max(mine, key=lambda r: (r["faithfulness"], -r["transfer"])) if mine else None
                cells.append(f"{b['faithfulness']:.3f} (t={b['transfer']})" if b else "-")
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
        lines.append("")
    nec = HERE / "necessity.json"
    if nec.is_file():
        blocks = json.loads(nec.read_text())["blocks"]
        (HERE / "necessity.svg").write_text(bars_svg(
            [(b["layer"], b["faithfulness"], b["ci_low"], b["ci_high"]) for b in blocks],
            "Necessity: faithfulness with the answer positions reading only BOS and themselves in one block", "block"))
        lines += ["Necessity (faithfulness when block l's answer positions read only BOS and themselves):", "",
                  "| block | " + " | ".join(str(b["layer"]) for b in blocks) + " |", "|---|" + "---|" * len(blocks),
                  "| faithfulness | " + " | ".join(f"{b['faithfulness']:.2f}" for b in blocks) + " |", ""]
    lens = HERE / "lens.json"
    if lens.is_file():
        rows = json.loads(lens.read_text())["rows"]
        labels = [r["label"] for r in rows]
        (HERE / "lens.svg").write_text(lines_svg(labels, {
            "P(first answer digit)": [r["answer_prob"] for r in rows],
            "answer digit top-1": [r["answer_top1"] for r in rows],
            "numeric top-1": [r["top1_numeric"] for r in rows],
        }, "Early decoding at the last prompt position"))
        lines += ["Early decoding (last prompt position, first answer token; mean over prompts):", "",
                  "| sub-layer | P(answer) | answer top-1 | answer rank (median) | top-1 numeric |", "|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['label']} | {r['answer_prob']:.3f} | {r['answer_top1']:.2f} | "
                         f"{r.get('answer_rank_median', float('nan')):g} | {r['top1_numeric']:.2f} |")
        lines.append("")
    curve = HERE / "prune" / "curve.jsonl"
    if curve.is_file():
        steps = read_jsonl(curve)
        (HERE / "prune.svg").write_text(bars_svg(
            [(r["n_heads_kept"], r["faithfulness"], r["ci_low"], r["ci_high"]) for r in steps],
            "Pruning the transfer heads of CAMA (19, 5): faithfulness on its own answers", "heads kept"))
        lines += ["Pruning (greedy, one head removed per step; faithfulness relative to the configuration's own "
                  "answers):", "", "| step | heads kept | removed | faithfulness | 95% interval |", "|---|---|---|---|---|"]
        for r in steps:
            removed = f"L{r['removed'][0]}H{r['removed'][1]}" if r.get("removed") else "-"
            lines.append(f"| {r['step']} | {r['n_heads_kept']} | {removed} | {r['faithfulness']:.3f} | "
                         f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] |")
        lines.append("")
    (HERE / "tables.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
