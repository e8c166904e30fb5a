"""Numbers and documents ready for strict JSON (NaN and infinities as ``null``), shared by the lens's results,
interchange checks and ``lens.json``."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_number", "json_ready"]


def json_number(x: float) -> int | float | None:
    """``x`` as an ``int`` when it is integral, ``None`` for NaN, else the float."""
    x = float(x)
    if math.isnan(x):
        return None
    return int(x) if x.is_integer() else x


def json_ready(obj: object) -> Any:
    """NaN/inf -> None, recursively, so ``json.dumps`` writes strict JSON."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_ready(v) for v in obj]
    return obj
