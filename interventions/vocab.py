"""The intervention layer's vocabulary, in one place: ablations of the residual stream and methods of head
ablation. :mod:`circuits.vocab` re-exports these and adds the analyses' own words."""

from __future__ import annotations

from typing import Literal, get_args

Ablation = Literal["cama", "mean", "zero"]
"""How the residual after block ``wait`` is replaced: CAMA (conditional means), plain per-position mean or
zero."""
ABLATIONS: tuple[str, ...] = get_args(Ablation)

MEANS_ABLATIONS: tuple[str, ...] = ("cama", "mean")
"""The ablations that need a :class:`~interventions.MeanCache`."""

HeadMethod = Literal["zero", "mean"]
"""How a head's output ``hook_z`` is removed: zero, or its per-position mean over the fit prompts."""
HEAD_METHODS: tuple[str, ...] = get_args(HeadMethod)
