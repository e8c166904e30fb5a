"""The parts of a model an edge graph reads: each component's output and each receiver's own input.

An edge ``u -> v`` carries component ``u``'s output into one input of component ``v``. The outputs are
the embedding (``blocks.0.hook_resid_pre``: token plus any absolute position embedding), every attention
head's output (``blocks.{l}.attn.hook_z[:, :, h] @ W_O[l, h]``, ``d_model`` wide, without the shared bias
``b_O``) and every MLP's output (``blocks.{l}.hook_mlp_out``). The inputs are hook points that hold one
receiver's copy of the residual stream, so an edit there changes that receiver alone:

* ``blocks.{l}.hook_q_input`` ``[batch, pos, n_heads, d_model]``: each query head's input;
* ``blocks.{l}.hook_k_input`` / ``hook_v_input`` ``[batch, pos, n_kv_heads, d_model]``: each **key/value
  head's** input (grouped-query attention keeps one per key/value head, shared by its query heads);
* ``blocks.{l}.hook_mlp_in`` ``[batch, pos, d_model]``: the MLP's input;
* ``blocks.{n_layers-1}.hook_resid_post``: the input of the final norm and unembedding (the logits).

``HookedTransformer`` and ``TransformerBridge`` compute these only when asked (``use_split_qkv_input``,
``use_hook_mlp_in``); :func:`split_inputs` switches both on for a ``with`` block and restores them after.
Adapters offer this as the capability ``split_inputs`` (:class:`interventions.adapter.Capabilities`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float

from .errors import InterventionError
from .hooks import resid_post, resid_pre, z

if TYPE_CHECKING:
    from .adapter import ModelAdapter

__all__ = ["embed_out", "final_in", "head_out_weights", "input_hook", "mlp_out", "split_inputs", "z"]

INPUTS = ("q", "k", "v", "mlp", "logits")
"""The receiver inputs of an edge graph: a query head's query, a key/value head's key or value, an MLP,
the logits."""


def input_hook(kind: str, layer: int) -> str:
    """Hook point of a receiver input ``kind`` (``"q"``, ``"k"``, ``"v"``, ``"mlp"``) of block ``layer``."""
    if kind in ("q", "k", "v"):
        return f"blocks.{layer}.hook_{kind}_input"
    if kind == "mlp":
        return f"blocks.{layer}.hook_mlp_in"
    raise InterventionError(f"input kind {kind!r} is not valid: choose one of 'q', 'k', 'v', 'mlp'")


def embed_out() -> str:
    """Hook point of the embedding's output (the residual entering block 0)."""
    return resid_pre(0)


def final_in(n_layers: int) -> str:
    """Hook point of the logits' input (the residual after the last block, before the final norm)."""
    return resid_post(n_layers - 1)


def mlp_out(layer: int) -> str:
    """Hook point of the MLP output of block ``layer``: ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_mlp_out"


def head_out_weights(adapter: ModelAdapter) -> Float[torch.Tensor, "n_layers n_heads d_head d_model"]:
    """``W_O`` of every block: head ``h`` of block ``l`` writes ``z[..., h, :] @ W_O[l, h]`` into the residual."""
    if not adapter.capabilities.split_inputs:
        raise InterventionError(adapter.missing("head_out_weights", "split_inputs"))
    return adapter.model.W_O


@contextmanager
def split_inputs(adapter: ModelAdapter) -> Iterator[None]:
    """Inside the ``with`` block the model computes one input per query head, key/value head and MLP (the hook
    points of the module docstring); the former settings come back on exit, also after an exception."""
    if not adapter.capabilities.split_inputs:
        raise InterventionError(adapter.missing("split_inputs", "split_inputs"))
    model, cfg = adapter.model, adapter.model.cfg
    before = (bool(getattr(cfg, "use_split_qkv_input", False)), bool(getattr(cfg, "use_hook_mlp_in", False)))
    mlps = not bool(getattr(cfg, "attn_only", False))
    try:
        model.set_use_split_qkv_input(True)
        if mlps:
            model.set_use_hook_mlp_in(True)
        yield
    finally:
        model.set_use_split_qkv_input(before[0])
        if mlps:
            model.set_use_hook_mlp_in(before[1])
