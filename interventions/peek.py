"""Attention-based peeking (ABP): restrict which keys chosen query rows may attend to.

Implemented at ``blocks.{l}.attn.hook_pattern`` (post-softmax): forbidden entries are zeroed and each
restricted row is renormalised to sum to 1. This equals masking the pre-softmax scores with ``-inf``
(``softmax`` restricted to the allowed keys). Backends whose attention takes masks (capability
``attention_masks``: nnsight, where attention may run in SDPA kernels that expose no pattern) apply
the same restriction as a per-block mask of allowed keys (:meth:`Peek.mask_hooks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from . import adapter as hooks
from .adapter import ModelInfo
from .base import OMIT_DEFAULT, ForwardContext, HookBody, Intervention, to_tuple
from .types import InterventionError
from .validation import check_choice

MODES = ("full", "self")
QUERIES = ("last", "others", "all")


def allowed_keys(n_pos: int, mode: str, queries: str, keep_bos: bool = True, device: Any = None,
                 n_last: int = 1) -> torch.Tensor:
    """Boolean ``[query_pos, key_pos]`` mask of links a :class:`Peek` keeps (rows it does not select
    are fully causal). ``full``: the whole causal row. ``self``: the query itself, plus BOS (key 0)
    when ``keep_bos``. ``n_last``: how many final positions make up ``"last"`` (see :func:`selected_rows`)."""
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=device).tril()
    if mode == "full":
        return causal
    restricted = torch.eye(n_pos, dtype=torch.bool, device=device)
    if keep_bos:
        restricted[:, 0] = True
    rows = selected_rows(n_pos, queries, device, n_last)
    return torch.where(rows[:, None], restricted & causal, causal)


def selected_rows(n_pos: int, queries: str, device: Any = None, n_last: int = 1) -> torch.Tensor:
    """Boolean ``[query_pos]``: the query rows ``queries`` selects. ``last``: the final ``n_last`` positions
    (``n_pos-n_last .. n_pos-1``; 1: the last prompt token; with an answer of ``k`` tokens read under teacher
    forcing, ``k``: the last prompt token and the first ``k-1`` answer tokens, each predicting the next answer
    token); ``others``: every other position; ``all``: every position."""
    rows = torch.zeros(n_pos, dtype=torch.bool, device=device)
    if queries == "last":
        rows[-n_last:] = True
    elif queries == "others":
        rows[:-n_last] = True
    else:
        rows[:] = True
    return rows


@dataclass(frozen=True)
class Peek(Intervention):
    """Peeking in blocks ``layers`` (0-indexed) for the query rows ``queries``.

    * ``mode="full"``: the rows see every earlier key (the ordinary causal row);
    * ``mode="self"``: the rows see only themselves and, with ``keep_bos``, BOS at position 0;
    * ``queries``: ``"last"`` (the last ``n_last`` positions, default the last one), ``"others"`` (every other
      position), ``"all"``.

    The same mask applies to every head (query heads, also with grouped-query attention).
    """

    layers: tuple[int, ...] = ()
    mode: str = "self"
    queries: str = "all"
    keep_bos: bool = True
    n_last: int = field(default=1, metadata={OMIT_DEFAULT: True})

    def __repr__(self) -> str:
        return f"Peek({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in self.spec_fields())})"

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", to_tuple(self.layers, "Peek layers"))
        check_choice("Peek mode", self.mode, MODES)
        check_choice("Peek queries", self.queries, QUERIES)
        if not isinstance(self.keep_bos, bool):
            raise InterventionError(f"Peek keep_bos={self.keep_bos!r} must be True or False")
        if not isinstance(self.n_last, int) or isinstance(self.n_last, bool) or self.n_last < 1:
            raise InterventionError(f"Peek n_last={self.n_last!r} must be an integer >= 1")
        for layer in self.layers:
            if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
                raise InterventionError(f"Peek layer {layer!r} must be an integer >= 0")
        if len(set(self.layers)) != len(self.layers):
            raise InterventionError(f"Peek layers {list(self.layers)} list a block twice")

    def validate(self, info: ModelInfo) -> None:
        for layer in self.layers:
            info.check_layer(layer, "Peek layer")

    def allowed(self, n_pos: int, device: Any = None) -> torch.Tensor:
        """Boolean ``[query_pos, key_pos]`` mask of the keys this peek lets each query attend to, for prompts
        of ``n_pos`` tokens (rows it does not select keep the whole causal row; see :func:`allowed_keys`)."""
        return allowed_keys(n_pos, self.mode, self.queries, self.keep_bos, device, self.n_last)

    def mask_hooks(self, info: ModelInfo) -> list[tuple[str, HookBody]]:
        """The peek as per-block attention masks: each block's mask is restricted to :meth:`allowed` (same
        numbers as the pattern edit of :meth:`hooks`: softmax over the allowed keys)."""

        mode, queries, keep_bos, n_last = self.mode, self.queries, self.keep_bos, self.n_last  # the hook holds these

        def body(mask: torch.Tensor, hook: Any = None) -> torch.Tensor:
            return mask & allowed_keys(mask.shape[-1], mode, queries, keep_bos, mask.device, n_last)

        return [(hooks.attn_mask(layer), body) for layer in self.layers]

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        if self.mode == "full":
            # The causal row is already what softmax produced: nothing to change, but the hook is kept
            # so that apply() can verify the block really ran.
            def identity(pattern: torch.Tensor, hook: Any = None) -> None:
                return None

            return [(hooks.pattern(layer), identity) for layer in self.layers]

        # Masks are cached per shape and device, and apart for inference mode: a mask made under
        # torch.inference_mode() cannot enter a pass that autograd records (permanent hooks, such as a
        # planted mask, see both kinds of pass).
        masks: dict[tuple[int, torch.device, bool], torch.Tensor] = {}

        def body(pattern: torch.Tensor, hook: Any = None) -> torch.Tensor:
            n_q, n_k = pattern.shape[-2:]
            key = (n_q, pattern.device, torch.is_inference_mode_enabled())
            if key not in masks:
                masks[key] = allowed_keys(n_q, self.mode, self.queries, self.keep_bos, pattern.device, self.n_last)
            kept = pattern * masks[key]
            return kept / kept.sum(dim=-1, keepdim=True)

        return [(hooks.pattern(layer), body) for layer in self.layers]
