"""Shared types of the toolkit: tensor shapes and identifiers (the errors, re-exported here, live in
:mod:`interventions.errors`).

Conventions used everywhere in ``interventions`` and ``circuits``:

* Blocks (layers) are 0-indexed: block ``l`` is ``model.blocks[l]``; ``n_layers`` blocks in all.
* Positions are 0-indexed; position 0 holds BOS (always prepended), position ``-1`` is the last prompt
  token, whose next-token prediction is the answer.
* A *layout* is one token length: CAMA and per-position means require every prompt of a batch to have
  the same length (no padding).
* Heads are named ``(layer, head)`` with ``head`` a *query* head index, also in grouped-query models.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int

from .errors import CacheMismatchError, InterventionError, InterventionNotAppliedError

__all__ = ["CacheMismatchError", "Head", "InterventionError", "InterventionNotAppliedError", "Logits", "Tokens"]

Tokens = Int[torch.Tensor, "batch pos"]
"""Token ids of one layout: a ``torch.long`` tensor of shape ``[batch, pos]``, BOS at position 0."""

Logits = Float[torch.Tensor, "batch pos d_vocab"]
"""Logits of every position: ``[batch, pos, d_vocab]``."""

Head = tuple[int, int]
"""A query head, ``(layer, head)``, both 0-indexed."""
