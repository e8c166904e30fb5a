"""The configuration of an ``af1 lens`` run (:class:`LensConfig`), importable without torch (the command line's flags
are declared on its fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.flags import flag
from circuits.validation import check_choice, check_positive
from circuits.vocab import DECODES

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo

__all__ = ["LensConfig"]


@dataclass(frozen=True)
class LensConfig:
    """What determines an ``af1 lens`` run besides the model and the prompts: ``decode``
    (``"final_norm"`` or ``"raw"``), ``top_k`` of the visibility test, ``interchange`` (run the check),
    ``seed`` (counterfactual pairs), ``batch_size`` (prompts per forward pass)."""

    decode: str = field(default="final_norm", metadata=flag(
        "final_norm: ln_final then unembedding; raw: unembedding only", choices=DECODES))
    top_k: int = field(default=10, metadata=flag("k of the operand/operator visibility test"))
    interchange: bool = field(default=True, metadata=flag("skip the attention interchange check",
                                                          name="--no-interchange"))
    seed: int = 0
    batch_size: int = 64
    n_boot: int = 1000

    def validate(self, info: ModelInfo | None = None) -> LensConfig:
        check_choice("decode", self.decode, DECODES)
        check_positive("top_k", self.top_k)
        check_positive("batch_size", self.batch_size)
        return self
