"""Offline HTML report of a head-pruning run (plotly; opens without a network): the figures of
:mod:`circuits.prune.figures` (importable from here too) with the run's settings and its smallest head set.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from circuits.prune.figures import attention_figure, curve_figure, figures, kept_heads_figure
from circuits.prune.result import PruneResult
from circuits.report import write_page
from circuits.tasks.formats import describe_prompts
from interventions.types import JsonMapping

__all__ = ["attention_figure", "curve_figure", "figures", "kept_heads_figure", "write_prune_report"]


def write_prune_report(path: str | Path, result: PruneResult, meta: JsonMapping,
                       notes: Sequence[str] = ()) -> Path:
    """Write the report of ``result`` to ``path`` (one self-contained HTML file)."""
    figs = figures(result)
    cfg = result.config
    smallest = (
        "no head set reaches the target"
        if result.smallest_head_set is None
        else " ".join(f"L{layer}H{head}" for layer, head in result.smallest_head_set)
        + f" (faithfulness {result.smallest_faithfulness:.3f})"
    )
    notes = [
        f"wait={cfg.wait}, transfer={cfg.transfer}, ablation={cfg.ablation}, method={cfg.method}, "
        f"rank={cfg.rank}, confirm_top={cfg.confirm_top}; {result.n_prompts} prompts ({result.n_dropped} "
        f"dropped: the unmodified model got them wrong).",
        f"Smallest head set with faithfulness >= {cfg.target:g}: {smallest}.",
        f"Prompts: {describe_prompts(meta)}.",
        *notes,
    ]
    title = f"Head pruning: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'}"
    return write_page(path, title, figs, notes)
