"""The configuration of one pruning run (a frozen dataclass validated against the model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interventions.validation import check_choice

METHODS = ("zero", "mean")
RANKS = ("attribution", "none")
ABLATIONS = ("cama", "mean", "zero")
NOT_IDENTITY = ("command", "base_accuracy", "n_checked")
"""``meta`` keys that describe a run without changing its results (not part of its identity)."""


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run. ``wait``/``transfer`` as in :func:`interventions.af1_subgraph`
    (0-indexed last waiting block; number of transfer blocks); ``target`` is a faithfulness fraction."""

    wait: int
    transfer: int
    ablation: str = "cama"
    method: str = "zero"
    target: float = 0.9
    rank: str = "attribution"
    confirm_top: int | None = None
    batch_size: int = 128
    n_boot: int = 1000
    seed: int = 0

    def validate(self, n_layers: int) -> None:
        """Raise ``ValueError`` naming the bad value and the valid range."""
        if not isinstance(self.wait, int) or not -1 <= self.wait <= n_layers - 2:
            raise ValueError(
                f"wait={self.wait!r} is out of range: valid -1..{n_layers - 2} for a model of {n_layers} "
                f"blocks (at least one transfer block must follow the last waiting block)"
            )
        if not isinstance(self.transfer, int) or self.transfer == 0:
            raise ValueError(
                f"transfer={self.transfer!r}: head pruning needs transfer heads, give transfer "
                f"1..{n_layers - 1 - self.wait} for wait={self.wait}"
            )
        if not 1 <= self.transfer <= n_layers - 1 - self.wait:
            raise ValueError(
                f"transfer={self.transfer} is out of range for wait={self.wait}: valid "
                f"1..{n_layers - 1 - self.wait} ({n_layers} blocks)"
            )
        check_choice("ablation", self.ablation, ABLATIONS)
        check_choice("method", self.method, METHODS)
        check_choice("rank", self.rank, RANKS)
        if not 0.0 <= float(self.target) <= 1.0:
            raise ValueError(f"target={self.target} is out of range: a faithfulness fraction in [0, 1]")
        if self.confirm_top is not None:
            if self.rank != "attribution":
                raise ValueError(
                    f"confirm_top={self.confirm_top} needs rank='attribution' (rank='none' confirms every "
                    f"candidate)"
                )
            if not isinstance(self.confirm_top, int) or isinstance(self.confirm_top, bool) or self.confirm_top < 1:
                raise ValueError(f"confirm_top={self.confirm_top!r} must be an integer >= 1 (or None = all)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or self.n_boot < 1:
            raise ValueError(f"n_boot={self.n_boot!r} must be an integer >= 1")

    def subgraph_fields(self) -> dict[str, Any]:
        """The fields that name the pruned subgraph and the pruning method (shared by the run identity and
        the summary)."""
        return {"wait": self.wait, "transfer": self.transfer, "ablation": self.ablation, "method": self.method,
                "rank": self.rank, "confirm_top": self.confirm_top}

    @property
    def needs_means(self) -> bool:
        return self.ablation in ("cama", "mean") or self.method == "mean"
