"""Deprecated: the lens report lives in :mod:`circuits.lens.report`; this module only re-exports it."""

from __future__ import annotations

import warnings

from circuits.lens.report import MAX_HEATMAP_PROMPTS, TITLES, lens_json, write_lens_outputs

__all__ = ["MAX_HEATMAP_PROMPTS", "TITLES", "lens_json", "write_lens_outputs"]

warnings.warn(
    "circuits.lens_report is deprecated: import from circuits.lens.report instead",
    DeprecationWarning,
    stacklevel=2,
)
