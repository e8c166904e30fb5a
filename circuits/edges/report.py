"""The offline HTML report of an edge attribution run: the graph and curve figures with the run's settings,
the areas and the top edges."""

from __future__ import annotations

from pathlib import Path

from circuits.edges.result import EdgesResult
from circuits.report import write_page

__all__ = ["write_edges_report"]


def write_edges_report(path: str | Path, result: EdgesResult) -> Path:
    """Write the report of ``result`` to ``path`` (one self-contained HTML file)."""
    cfg, lay = result.config, result.layout
    notes = [
        f"{cfg['method']} ({cfg['steps']} steps, path {cfg['ig_path']}) against the {cfg['counterfactual']} "
        f"counterfactual; {result.n_prompts} prompts of {lay.n_pos} positions; "
        f"{len(result.table['score'])} edges ({int(result.table['candidate'].sum())} candidates"
        + (f", AF1 subgraph wait={cfg['wait']} transfer={cfg['transfer']}" if cfg.get("wait") is not None else "")
        + f"); clean logit difference {result.clean_metric:.3f}.",
        "Score: estimated change of the mean logit difference when the edge alone reads the counterfactual "
        "(negative: the edge helps the answer).",
    ]
    if result.curve is not None:
        c = result.curve
        notes.append(f"Edge patching: CPR {c.cpr:.3f} [{c.cpr_ci[0]:.3f}, {c.cpr_ci[1]:.3f}], CMD {c.cmd:.3f} "
                     f"[{c.cmd_ci[0]:.3f}, {c.cmd_ci[1]:.3f}]; model {c.full:.3f}, empty circuit {c.empty:.3f} "
                     f"(mean logit difference).")
    top = result.top(10)
    notes.append("Top edges: " + "; ".join(f"{e['src']}@{e['src_pos']} -> {e['dst']}@{e['dst_pos']} ({e['input']}) "
                                           f"{e['score']:.3g}" for e in top))
    model = result.meta.get("model") or "model"
    return write_page(path, f"Edges: {model} on {result.meta.get('task') or 'prompts'}", result.figures(), notes)
