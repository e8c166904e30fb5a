"""The configuration of an ``af1 edges`` run (:class:`EdgesConfig`), importable without torch (the command line's
flags are declared on its fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError
from circuits.flags import flag
from circuits.validation import check_choice, check_config, check_int, check_positive

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo

__all__ = ["COUNTERFACTUALS", "EDGE_METHODS", "IG_PATHS", "EdgesConfig"]

EDGE_METHODS = ("eap-ig", "eap")
"""Edge attribution methods: integrated gradients (``--steps`` points) or one gradient at the clean run."""
COUNTERFACTUALS = ("cama", "mean", "zero", "corrupted")
"""What a removed edge carries instead: the sender's CAMA mean, plain mean, zero, or its output on another
prompt of the same layout (other operands)."""
IG_PATHS = ("inputs", "edges")
"""EAP-IG's path: the embedding moves from counterfactual to clean (the paper's), or every edge together."""


@dataclass(frozen=True)
class EdgesConfig:
    """What determines an ``af1 edges`` run besides the model and the prompts. ``wait``/``transfer`` (both or
    neither) restrict the candidate edges to that AF1 subgraph (:func:`circuits.edges.circuit.af1_allowed`)."""

    method: str = field(default="eap-ig", metadata=flag("edge attribution method", choices=EDGE_METHODS))
    steps: int = field(default=5, metadata=flag("EAP-IG interpolation points (forward+backward passes per batch)"))
    ig_path: str = field(default="inputs", metadata=flag(
        "EAP-IG path: inputs (embedding, as the paper) or edges (all edges removed together)", choices=IG_PATHS))
    counterfactual: str = field(default="cama", metadata=flag(
        "what a removed edge carries: CAMA mean, plain mean, zero, or another prompt's output",
        choices=COUNTERFACTUALS))
    aggregate_positions: bool = field(default=False, metadata=flag(
        "position-free graph (scores summed over positions; memory and time / positions)"))
    wait: int | None = field(default=None, metadata=flag(
        "restrict candidates to the AF1 subgraph: last waiting block (with --transfer)", type=int))
    transfer: int | None = field(default=None, metadata=flag("number of transfer blocks (with --wait)", type=int))
    curve: bool = field(default=True, metadata=flag("skip the faithfulness curve (edge patching of top-n circuits)",
                                                     name="--no-curve"))
    top: int = field(default=40, metadata=flag("edges drawn in the graph figure and listed in the summary"))
    batch_size: int = 16
    n_boot: int = 1000
    seed: int = 0

    def validate(self, info: ModelInfo | int | None = None) -> EdgesConfig:
        """:class:`~circuits.errors.ArgumentError` naming the first bad value (``info``: the model's
        :class:`~interventions.ModelInfo` or its block count, or ``None`` before loading). Returns the config."""
        check_choice("method", self.method, EDGE_METHODS)
        check_choice("ig_path", self.ig_path, IG_PATHS)
        check_choice("counterfactual", self.counterfactual, COUNTERFACTUALS)
        check_positive("steps", self.steps)
        check_positive("top", self.top)
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        if (self.wait is None) != (self.transfer is None):
            raise ArgumentError("give --wait and --transfer together (the AF1 subgraph), or neither")
        n_layers = info if isinstance(info, int) or info is None else int(info.n_layers)
        if self.wait is not None:
            if self.aggregate_positions:
                raise ArgumentError("--wait/--transfer restrict positions: leave out --aggregate-positions")
            if n_layers is None:
                check_int("wait", self.wait, -1)
                check_int("transfer", self.transfer, 1)
            else:
                check_config(n_layers, self.wait, self.transfer, min_transfer=1)
        return self

    def subgraph(self) -> tuple[int, int] | None:
        """``(wait, transfer)`` of the candidate restriction, or ``None``."""
        return None if self.wait is None or self.transfer is None else (self.wait, self.transfer)

    def means_kind(self) -> str | None:
        """The means the runner fits a fit set for: ``cama`` (conditional), ``mean``, or none."""
        return self.counterfactual if self.counterfactual in ("cama", "mean") else None
