"""The configuration of one pruning run (a frozen dataclass validated against the model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuits.errors import ArgumentError
from circuits.validation import check_choice, check_config, check_fraction, check_positive
from circuits.vocab import ABLATIONS, HEAD_METHODS, RANKS, Ablation, HeadMethod, Rank

NOT_IDENTITY = ("command", "base_accuracy", "n_checked")
"""``meta`` keys that describe a run without changing its results (not part of its identity)."""


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run. ``wait``/``transfer`` as in :func:`interventions.af1_subgraph`
    (0-indexed last waiting block; number of transfer blocks); ``target`` is a faithfulness fraction."""

    wait: int
    transfer: int
    ablation: Ablation = "cama"
    method: HeadMethod = "zero"
    target: float = 0.9
    rank: Rank = "attribution"
    confirm_top: int | None = None
    batch_size: int = 128
    n_boot: int = 1000
    seed: int = 0

    def validate(self, n_layers: int) -> None:
        """Raise :class:`~circuits.errors.ArgumentError` naming the bad value and the valid range
        (``(wait, transfer)``: :func:`circuits.vocab.config_problem` with at least one transfer block)."""
        if self.transfer == 0 and isinstance(self.wait, int) and -1 <= self.wait <= n_layers - 2:
            raise ArgumentError(
                f"transfer={self.transfer!r}: head pruning needs transfer heads, give transfer "
                f"1..{n_layers - 1 - self.wait} for wait={self.wait}"
            )
        check_config(n_layers, self.wait, self.transfer, min_transfer=1)
        check_choice("ablation", self.ablation, ABLATIONS)
        check_choice("method", self.method, HEAD_METHODS)
        check_choice("rank", self.rank, RANKS)
        check_fraction("target", self.target)
        if self.confirm_top is not None:
            if self.rank != "attribution":
                raise ArgumentError(
                    f"confirm_top={self.confirm_top} needs rank='attribution' (rank='none' confirms every "
                    f"candidate)"
                )
            check_positive("confirm_top", self.confirm_top)
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)

    def subgraph_fields(self) -> dict[str, Any]:
        """The fields that name the pruned subgraph and the pruning method (shared by the run identity and
        the summary)."""
        return {"wait": self.wait, "transfer": self.transfer, "ablation": self.ablation, "method": self.method,
                "rank": self.rank, "confirm_top": self.confirm_top}
