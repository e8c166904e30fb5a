"""The configurations of an AF1 search (:class:`SearchConfig`) and of one fixed configuration (:class:`FixedConfig`),
validated before anything is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.flags import flag
from circuits.validation import check_choice, check_config, check_fraction, check_int, check_positive
from circuits.vocab import ABLATIONS, GRIDS, SEARCH_METHODS, Ablation, Grid, SearchMethod

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo
    from interventions.types import JsonDict


@dataclass(frozen=True)
class SearchConfig:
    """What determines an AF1 search besides the model and the prompts.

    ``threshold``: faithfulness (fraction in [0, 1]) a configuration needs; ``grid``: ``"auto"`` (what
    the selection needs) or ``"full"``; ``ablation``: ``"cama"``, ``"mean"`` or ``"zero"`` after block
    ``wait``; ``method``: ``"fast"`` (exact shortcuts) or ``"naive"``; ``seed``: bootstrap seed;
    ``batch_size``: prompts per forward pass; ``n_boot``: bootstrap resamples per interval;
    ``configs_per_pass``: configurations per forward pass where the backend runs several at once (nnsight).
    """

    threshold: float = field(default=0.9, metadata=flag(
        "faithfulness a configuration needs, a fraction in [0, 1]"))
    grid: Grid = field(default="auto", metadata=flag(
        "full: every (wait, transfer) for the heatmap; auto: only what the selection needs (same selection)",
        choices=GRIDS))
    ablation: Ablation = field(default="cama", metadata=flag(
        "ablation after the wait block: cama or the mean/zero baselines", choices=ABLATIONS))
    method: SearchMethod = field(default="fast", metadata=flag(
        "fast (exact shortcuts) or naive (one full forward per configuration)", choices=SEARCH_METHODS))
    seed: int = 0
    batch_size: int = 128
    n_boot: int = 1000
    configs_per_pass: int = field(default=8, metadata=flag(
        "configurations of one wait evaluated in one forward pass where the backend allows it (nnsight: one request "
        "each)"))

    def validate(self, info: ModelInfo | None = None) -> SearchConfig:
        """Raise :class:`ArgumentError` naming the first bad field (``info``: unused, every model fits)."""
        check_fraction("threshold", self.threshold)
        check_choice("grid", self.grid, GRIDS)
        check_choice("ablation", self.ablation, ABLATIONS)
        check_choice("method", self.method, SEARCH_METHODS)
        check_int("seed", self.seed, -(2**63))
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        check_positive("configs_per_pass", self.configs_per_pass)
        return self

    def identity(self) -> JsonDict:
        """The fields that determine the per-configuration results. The threshold only changes the
        selection, which is recomputed from the stored results, so it is not one of them (nor are grid,
        method, batch size and configurations per pass); directories of earlier releases, whose
        ``run.json`` records a threshold, resume with any."""
        return {"ablation": self.ablation, "seed": int(self.seed), "n_boot": int(self.n_boot)}


@dataclass(frozen=True)
class FixedConfig:
    """One configuration: ``wait`` (last waiting block, 0-indexed; -1 = no ablation), ``transfer``
    (number of transfer blocks), ``ablation``, bootstrap ``seed``/``n_boot`` and ``batch_size``."""

    wait: int = field(metadata=flag("fixed configuration: last waiting block (0-indexed; -1 = no ablation)",
                                    type=int))
    transfer: int = field(metadata=flag("fixed configuration: transfer blocks", type=int))
    ablation: Ablation = "cama"
    seed: int = 0
    batch_size: int = 128
    n_boot: int = 1000

    def validate(self, info: ModelInfo | None = None) -> FixedConfig:
        check_choice("ablation", self.ablation, ABLATIONS)
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        check_int("wait", self.wait, -1)
        check_int("transfer", self.transfer, 0)
        if info is not None:
            check_config(info.n_layers, self.wait, self.transfer)
        return self

    def identity(self) -> JsonDict:
        return {"wait": int(self.wait), "transfer": int(self.transfer), "ablation": self.ablation,
                "seed": int(self.seed), "n_boot": int(self.n_boot)}
