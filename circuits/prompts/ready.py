"""Prompts ready to score, as the runner takes them (:class:`ReadyPrompts`): the token ids and answers, the fit set
of their means, the records for ``prompts.jsonl``, the run's description of them and, when a directory holds them,
the prepared prompts. A :class:`~circuits.prompts.spec.PromptSpec` becomes one through
:meth:`~circuits.prompts.spec.PromptSpec.ready`; tensors of one's own are one as they are (the Python API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Int

from circuits.prompts.fitset import FitSet
from circuits.prompts.prepared import Prepared, prepared_of
from interventions.types import JsonMapping, Model

if TYPE_CHECKING:
    from circuits.prompts.sampling import Prompts

__all__ = ["ReadyPrompts"]


@dataclass(frozen=True)
class ReadyPrompts:
    """Prompts ready to score.

    ``tokens``: ``[n, pos]`` token ids of one layout, BOS at position 0; ``answers``: ``[n]`` answer token ids (``[n,
    k]`` for answers of ``k`` tokens); ``fit``: the fit set their means are fitted on (``None``: none, or a cache the
    caller gives); ``records``: ``{"prompt", "answer", ...}`` records aligned with ``tokens`` (``None``: token ids);
    ``meta``: the run's description of them (task, source, format; ``base_accuracy`` and ``n_checked`` when they
    were checked; the caller's keys for its own tensors); ``spec``: the
    :class:`~circuits.prompts.spec.PromptSpec` they were prepared from (``None``: the caller's tensors);
    ``prepared``: the :class:`~circuits.prompts.prepared.Prepared` prompts kept in a run directory.
    """

    tokens: Int[torch.Tensor, "n pos"]
    answers: Int[torch.Tensor, " n *k"]
    fit: FitSet | None = None
    records: Sequence[JsonMapping] | None = None
    meta: JsonMapping = field(default_factory=dict)
    spec: Any = None
    prepared: Prepared | None = None

    @classmethod
    def of(cls, prompts: Prompts, spec: Any = None) -> ReadyPrompts:
        """The :class:`~circuits.prompts.sampling.Prompts` of ``spec`` (a prompt spec, or ``None``), with their base
        accuracy and the number of prompts checked in ``meta``."""
        meta = {**(spec.meta() if spec is not None else {}), "base_accuracy": prompts.base_accuracy,
                "n_checked": prompts.n_checked}
        return cls(tokens=prompts.tokens, answers=prompts.answers, fit=prompts.fit, records=prompts.records(),
                   meta=meta, spec=spec, prepared=prepared_of(prompts))

    def ready(self, model: Model, *, name: str | None, means: str | None, out: str | Path | None, progress: bool,
              batch_size: int) -> ReadyPrompts:
        """Themselves: they are ready (the runner asks every prompt source the same way)."""
        return self
