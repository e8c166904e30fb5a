"""The configuration of one pruning run (a frozen dataclass validated against the model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError
from circuits.flags import flag
from circuits.validation import check_choice, check_config, check_fraction, check_int, check_positive
from circuits.vocab import ABLATIONS, HEAD_METHODS, RANKS, Ablation, HeadMethod, Rank

if TYPE_CHECKING:
    from interventions.types import JsonDict

NOT_IDENTITY = ("command", "base_accuracy", "n_checked")
"""``meta`` keys that describe a run without changing its results (not part of its identity)."""


@dataclass(frozen=True)
class PruneConfig:
    """Settings of one pruning run. ``wait``/``transfer`` as in :func:`interventions.af1_subgraph`
    (0-indexed last waiting block; number of transfer blocks); ``target`` is a faithfulness fraction."""

    wait: int = field(metadata=flag("last waiting block (0-indexed; -1 = no ablation)", type=int))
    transfer: int = field(metadata=flag("number of transfer blocks (>= 1)", type=int))
    ablation: Ablation = field(default="cama", metadata=flag(
        "ablation of the residual after block --wait", choices=ABLATIONS))
    method: HeadMethod = field(default="zero", metadata=flag("how a head is removed", choices=HEAD_METHODS))
    target: float = field(default=0.9, metadata=flag(
        "faithfulness the smallest head set must keep, a fraction in [0, 1]"))
    rank: Rank = field(default="attribution", metadata=flag(
        "rank candidates by attribution patching before confirming them", choices=RANKS))
    confirm_top: int | None = field(default=None, metadata=flag(
        "confirm only the K best-ranked candidates per step (default: all, exact greedy)", type=int, metavar="K"))
    batch_size: int = 128
    n_boot: int = 1000
    seed: int = 0

    def validate(self, n_layers: int | None = None) -> PruneConfig:
        """Raise :class:`~circuits.errors.ArgumentError` naming the bad value and the valid range
        (``(wait, transfer)``: :func:`circuits.vocab.config_problem` with at least one transfer block, for a model of
        ``n_layers`` blocks; ``None``: before the model's size is known, only ``wait >= -1`` and ``transfer >= 1``).
        Returns the config."""
        if self.transfer == 0 and isinstance(self.wait, int) and (n_layers is None or -1 <= self.wait <= n_layers - 2):
            upto = f"1..{n_layers - 1 - self.wait}" if n_layers is not None else ">= 1"
            raise ArgumentError(
                f"transfer={self.transfer!r}: head pruning needs transfer heads, give transfer {upto} for "
                f"wait={self.wait}"
            )
        if n_layers is None:
            check_int("wait", self.wait, -1)
            check_int("transfer", self.transfer, 1)
        else:
            check_config(n_layers, self.wait, self.transfer, min_transfer=1)
        check_choice("ablation", self.ablation, ABLATIONS)
        check_choice("method", self.method, HEAD_METHODS)
        check_choice("rank", self.rank, RANKS)
        check_fraction("target", self.target)
        if self.confirm_top is not None:
            if self.rank != "attribution":
                raise ArgumentError(
                    f"confirm_top={self.confirm_top} needs rank=attribution (rank=none confirms every candidate)"
                )
            check_positive("confirm_top", self.confirm_top)
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        return self

    def subgraph_fields(self) -> JsonDict:
        """The fields that name the pruned subgraph and the pruning method (shared by the run identity and
        the summary)."""
        return {"wait": self.wait, "transfer": self.transfer, "ablation": self.ablation, "method": self.method,
                "rank": self.rank, "confirm_top": self.confirm_top}
