"""Hook names shared by every backend, and hook levels.

TransformerLens 3.9 ``HookedTransformer`` and ``TransformerBridge`` (3.9 preview and 4.x) expose the
same hook names; the helpers below build the ones the toolkit uses. Blocks are 0-indexed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

import torch


class HookPointLike(Protocol):
    """The hook point a hook function is called with: TransformerLens' ``HookPoint`` or the nnsight model's
    emulation of it. Hooks here read at most its ``name``."""

    @property
    def name(self) -> str | None:
        """The hook point's name (``blocks.3.hook_resid_post``)."""
        ...


HookFn = Callable[[torch.Tensor, "HookPointLike | None"], "torch.Tensor | None"]
"""A forward hook ``fn(activation, hook)``: returns ``None`` (observe) or the replacement activation."""


def resid_pre(layer: int) -> str:
    """Residual stream entering block ``layer`` (0-indexed): ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid(layer: int) -> str:
    """Residual stream between attention and MLP of block ``layer`` (sequential blocks only)."""
    return f"blocks.{layer}.hook_resid_mid"


def resid_post(layer: int) -> str:
    """Residual stream after block ``layer`` (0-indexed)."""
    return f"blocks.{layer}.hook_resid_post"


def pattern(layer: int) -> str:
    """Post-softmax attention pattern of block ``layer``: ``[batch, n_heads, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


PER_HEAD_MASK = "per_head_mask"
"""Attribute set (True) on a hook body at ``attn_mask`` points that returns one mask per query head
(``[n_heads, query_pos, key_pos]``): backends that join the masks of several prompt batches into one pass
run such a batch alone."""


def attn_mask(layer: int) -> str:
    """Boolean ``[query_pos, key_pos]`` mask of the keys each query of block ``layer`` may attend to (causal
    unless edited; backends with the ``attention_masks`` capability only)."""
    return f"blocks.{layer}.attn.hook_attn_mask"


def z(layer: int) -> str:
    """Per-head attention output before ``W_O``: ``[batch, pos, n_heads, d_head]`` (query heads)."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out(layer: int) -> str:
    """Attention output of block ``layer`` added to the residual: ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_attn_out"


def mlp_out(layer: int) -> str:
    """MLP output of block ``layer`` added to the residual: ``[batch, pos, d_model]``."""
    return f"blocks.{layer}.hook_mlp_out"


_levels = itertools.count(10_000)


def new_hook_level() -> int:
    """A fresh hook level: hooks added with it are removed together and touch no other hook."""
    return next(_levels)


def counting(fn: HookFn, on_fire: Callable[[], None] | None) -> HookFn:
    """``fn``, calling ``on_fire()`` first each time it runs (``fn`` itself when ``on_fire`` is None)."""
    if on_fire is None:
        return fn

    def hook(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor | None:
        on_fire()
        return fn(act, hook)

    return hook
