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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch
from jaxtyping import Float, Int

from .errors import CacheMismatchError, InterventionError, InterventionNotAppliedError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["CacheMismatchError", "DataFrame", "Figure", "Head", "InterventionError", "InterventionNotAppliedError",
           "JsonDict", "JsonMapping", "Logits", "Model", "ModelConfig", "Tokenizer", "Tokens"]

Tokens = Int[torch.Tensor, "batch pos"]
"""Token ids of one layout: a ``torch.long`` tensor of shape ``[batch, pos]``, BOS at position 0."""

Logits = Float[torch.Tensor, "batch pos d_vocab"]
"""Logits of every position: ``[batch, pos, d_vocab]``."""

Head = tuple[int, int]
"""A query head, ``(layer, head)``, both 0-indexed."""

JsonDict: TypeAlias = dict[str, Any]
"""A JSON object as the toolkit reads and writes it: run directories (``run.json``, ``summary.json``, records),
task and sweep files (TOML or JSON), identities and ``to_dict`` forms. Values are JSON values; each reader checks the
shape it needs where the file comes in (:mod:`circuits.store`, :mod:`circuits.tasks.files`)."""

JsonMapping: TypeAlias = Mapping[str, Any]
"""A :data:`JsonDict` a function only reads."""

Figure: TypeAlias = Any
"""A ``plotly.graph_objects.Figure`` (plotly is imported only where a figure is drawn, and ships no type
information)."""

Tokenizer: TypeAlias = "PreTrainedTokenizerBase"
"""A Hugging Face tokenizer (``model.tokenizer`` of every backend; fast tokenizers built offline by
:mod:`interventions.tokenization`)."""

DataFrame: TypeAlias = Any
"""A ``pandas.DataFrame`` (pandas is an optional import and ships no type information here)."""


class ModelConfig(Protocol):
    """The shapes every model the toolkit drives reports under TransformerLens names (``HookedTransformerConfig``,
    ``TransformerBridgeConfig``, the nnsight model's ``NNsightConfig``)."""

    @property
    def n_layers(self) -> int:
        """Blocks (0-indexed ``0 .. n_layers - 1``)."""
        ...

    @property
    def n_heads(self) -> int:
        """Query heads per block."""
        ...

    @property
    def d_model(self) -> int:
        """Width of the residual stream."""
        ...

    @property
    def d_head(self) -> int:
        """Width of one head."""
        ...

    @property
    def n_ctx(self) -> int:
        """Positions the model was built for."""
        ...

    @property
    def d_vocab(self) -> int:
        """Vocabulary size (rows of the unembedding)."""
        ...


class Model(Protocol):
    """What the adapters accept (:func:`interventions.adapt`): a ``HookedTransformer``, a ``TransformerBridge`` or an
    nnsight model (:class:`~interventions.backends.nnsight_model.NNsightModel`). Each is a torch module with a
    TransformerLens ``cfg`` and tokenizer; what differs between them (hooks, attention internals, partial
    forwards) is read through the model's adapter, never from the model itself. Other attributes (``tokenizer``,
    ``to_tokens``, ``W_U``) are the TransformerLens surface all three share, typed by the library that defines them."""

    @property
    def cfg(self) -> ModelConfig:
        """The model's shapes."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A forward pass: ``model(tokens)`` gives logits ``[batch, pos, d_vocab]``; the keyword arguments are the
        library's own (``stop_at_layer``, ...), which only that library's adapter passes."""
        ...

    def __getattr__(self, name: str) -> Any:
        """The rest of the TransformerLens surface (``tokenizer``, ``to_tokens``, ``hook_dict``, ...)."""
        ...
