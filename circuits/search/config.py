"""The configuration of one AF1 search, validated before anything is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from circuits.errors import ArgumentError
from circuits.search.rule import ABLATIONS, GRIDS, METHODS


def check_fraction(name: str, value: Any) -> float:
    """``value`` as a float in [0, 1] (a faithfulness fraction), else :class:`ArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= float(value) <= 1.0:
        raise ArgumentError(f"{name}={value!r} must be a fraction in [0, 1] (e.g. 0.9)")
    return float(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an integer ``>= minimum``, else :class:`ArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ArgumentError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def check_one_of(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else :class:`ArgumentError` listing them."""
    if value not in choices:
        raise ArgumentError(f"{name}={value!r} is not valid: choose one of {', '.join(map(repr, choices))}")
    return value


@dataclass(frozen=True)
class SearchConfig:
    """What determines an AF1 search besides the model and the prompts.

    ``threshold``: faithfulness (fraction in [0, 1]) a configuration needs; ``grid``: ``"auto"`` (what
    the selection needs) or ``"full"``; ``ablation``: ``"cama"``, ``"mean"`` or ``"zero"`` after block
    ``wait``; ``method``: ``"fast"`` (exact shortcuts) or ``"naive"``; ``seed``: bootstrap seed;
    ``batch_size``: prompts per forward pass; ``n_boot``: bootstrap resamples per interval;
    ``configs_per_pass``: configurations per forward pass where the backend runs several at once (nnsight).
    """

    threshold: float = 0.9
    grid: str = "auto"
    ablation: str = "cama"
    method: str = "fast"
    seed: int = 0
    batch_size: int = 128
    n_boot: int = 1000
    configs_per_pass: int = 8

    def validate(self, info: Any = None) -> "SearchConfig":
        """Raise :class:`ArgumentError` naming the first bad field (``info``: unused, every model fits)."""
        check_fraction("threshold", self.threshold)
        check_one_of("grid", self.grid, GRIDS)
        check_one_of("ablation", self.ablation, ABLATIONS)
        check_one_of("method", self.method, METHODS)
        check_int("seed", self.seed, -(2**63))
        check_int("batch_size", self.batch_size, 1)
        check_int("n_boot", self.n_boot, 1)
        check_int("configs_per_pass", self.configs_per_pass, 1)
        return self

    @property
    def needs_means(self) -> bool:
        return self.ablation in ("cama", "mean")

    def identity(self) -> dict[str, Any]:
        """The fields that determine the per-configuration results. The threshold only changes the
        selection, which is recomputed from the stored results, so it is not one of them (nor are grid,
        method, batch size and configurations per pass); directories of earlier releases, whose
        ``run.json`` records a threshold, resume with any."""
        return {"ablation": self.ablation, "seed": int(self.seed), "n_boot": int(self.n_boot)}
