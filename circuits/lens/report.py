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

import numpy as np

from circuits.report import write_page, write_text
from circuits.store import files
from circuits.tasks.formats import describe_prompts
from interventions.types import Figure, JsonDict, JsonMapping

from .figures import MAX_HEATMAP_PROMPTS, TITLES, figures, interchange_figure, metric_figure, rank_heatmap
from .interchange_check import InterchangeResult
from .jsonable import json_ready
from .result import LensResult

__all__ = ["TITLES", "MAX_HEATMAP_PROMPTS", "figures", "interchange_figure", "lens_json", "metric_figure",
           "meta_text", "rank_heatmap", "write_lens_outputs"]

def lens_json(
    result: LensResult,
    *,
    interchanges: Sequence[InterchangeResult] = (),
    meta: JsonMapping | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> JsonDict:
    """The ``lens.json`` document: ``meta`` keys first, then :meth:`LensResult.to_dict` (``prompts``,
    ``rows``, settings) and ``interchange`` (label -> :meth:`InterchangeResult.to_dict`)."""
    doc: JsonDict = dict(meta or {})
    doc["prompt_format"] = describe_prompts(doc)
    doc.update(result.to_dict(n_boot=n_boot, seed=seed))
    doc["interchange"] = {r.label or f"interchange{i}": r.to_dict() for i, r in enumerate(interchanges)}
    return json_ready(doc)


def _figures(doc: JsonMapping, result: LensResult, interchanges: Sequence[InterchangeResult]) -> list[Figure]:
    return figures(result, interchanges, rows=doc["rows"])


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
    meta: JsonMapping | None = None,
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
    figs = figures(result, interchanges, rows=doc["rows"])
    notes = [" · ".join(f"{k}: {meta_text(k, v)}" for k, v in (meta or {}).items() if k not in ("numbers", "format")),
             f"Decoding: {result.decode}; {result.n_prompts} prompts; last position; post-attention and "
             f"post-MLP residual states of every block (0-indexed).",
             f"Prompts: {describe_prompts(meta or {})}."]
    html_path = write_page(out / files.REPORT, "Early decoding (logit lens)", figs, notes)
    return json_path, html_path


def meta_text(key: str, value: object) -> str:
    """A value of the run's description as the report's header shows it: accuracies as percentages (``14.7%``),
    other floats to four significant digits, anything else as it is."""
    if isinstance(value, float) and key.endswith("accuracy"):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
