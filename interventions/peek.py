"""Attention-based peeking (ABP): restrict which keys chosen query rows may attend to, in every head of a
block or in chosen heads only.

Implemented at ``blocks.{l}.attn.hook_pattern`` (post-softmax, ``[batch, n_heads, query, key]``): forbidden
entries are zeroed and each restricted row is renormalised to sum to 1, in the restricted heads only. This
equals masking the pre-softmax scores with ``-inf`` (``softmax`` restricted to the allowed keys). Backends
whose attention takes masks (capability ``attention_masks``: nnsight, where attention may run in SDPA kernels
that expose no pattern) apply the same restriction as a per-block mask of allowed keys
(:meth:`Peek.mask_hooks`; ``[n_heads, query, key]`` when only some heads are restricted).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool

from . import adapter as hooks
from .adapter import ModelInfo
from .base import OMIT_DEFAULT, ForwardContext, HookBody, Intervention, to_tuple
from .hooks import PER_HEAD_MASK, HookPointLike
from .types import InterventionError
from .validation import check_choice

MODES = ("full", "self")
QUERIES = ("last", "others", "all")


def allowed_keys(n_pos: int, mode: str, queries: str, keep_bos: bool = True, device: torch.device | str | None = None,
                 n_last: int = 1) -> Bool[torch.Tensor, "query_pos key_pos"]:
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


def selected_rows(n_pos: int, queries: str, device: torch.device | str | None = None,
                  n_last: int = 1) -> Bool[torch.Tensor, " query_pos"]:
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

    ``heads``: which query heads the restriction applies to (0-indexed; with grouped-query attention the
    query heads, as everywhere in the toolkit): ``None`` (default) every head; a list of heads, e.g.
    ``(0, 3)``, the same heads in every block of ``layers``; or a mapping ``{layer: heads}`` per block (its
    keys are the blocks; ``layers`` may then be left empty). The other heads keep their full causal
    attention, so ``Peek([4], "self", "last", heads=(1,))`` asks whether head 1 of block 4 carries what the
    last token reads there.
    """

    layers: tuple[int, ...] = ()
    mode: str = "self"
    queries: str = "all"
    keep_bos: bool = True
    n_last: int = field(default=1, metadata={OMIT_DEFAULT: True})
    heads: Any = field(default=None, metadata={OMIT_DEFAULT: True})
    """Normalised to ``None``, a tuple of heads, or a tuple of ``(layer, heads)`` pairs sorted by layer."""

    def __repr__(self) -> str:
        return f"Peek({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in self.spec_fields())})"

    def __post_init__(self) -> None:
        if isinstance(self.heads, Mapping) and not self.layers:
            object.__setattr__(self, "layers", tuple(sorted(self.heads)))
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
        object.__setattr__(self, "heads", head_sets(self.heads, self.layers))

    def heads_of(self, layer: int) -> tuple[int, ...] | None:
        """The query heads this peek restricts in block ``layer`` (``None``: every head)."""
        if self.heads is None or not self.heads or isinstance(self.heads[0], int):
            return self.heads
        return dict(self.heads)[layer]

    def validate(self, info: ModelInfo) -> None:
        for layer in self.layers:
            info.check_layer(layer, "Peek layer")
            for head in self.heads_of(layer) or ():
                info.check_head(layer, head)

    def allowed(self, n_pos: int, device: torch.device | str | None = None) -> Bool[torch.Tensor, "query_pos key_pos"]:
        """Boolean ``[query_pos, key_pos]`` mask of the keys this peek lets each query attend to, for prompts
        of ``n_pos`` tokens (rows it does not select keep the whole causal row; see :func:`allowed_keys`)."""
        return allowed_keys(n_pos, self.mode, self.queries, self.keep_bos, device, self.n_last)

    def mask_hooks(self, info: ModelInfo) -> list[tuple[str, HookBody]]:
        """The peek as per-block attention masks: each block's mask is restricted to :meth:`allowed` (same
        numbers as the pattern edit of :meth:`hooks`: softmax over the allowed keys); with ``heads``, the mask
        becomes ``[n_heads, query, key]`` and only the chosen heads' rows are restricted."""

        mode, queries, keep_bos, n_last = self.mode, self.queries, self.keep_bos, self.n_last  # the hook holds these
        n_heads = info.n_heads

        def make(heads: tuple[int, ...] | None) -> HookBody:
            def body(mask: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
                allowed = allowed_keys(mask.shape[-1], mode, queries, keep_bos, mask.device, n_last)
                if heads is None:
                    return mask & allowed
                out = mask.expand(n_heads, *mask.shape[-2:]).clone()
                out[list(heads)] &= allowed
                return out

            setattr(body, PER_HEAD_MASK, heads is not None)
            return body

        return [(hooks.attn_mask(layer), make(self.heads_of(layer))) for layer in self.layers]

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        if self.mode == "full":
            # The causal row is already what softmax produced: nothing to change, but the hook is kept
            # so that apply() can verify the block really ran.
            def identity(pattern: torch.Tensor, hook: HookPointLike | None = None) -> None:
                return None

            return [(hooks.pattern(layer), identity) for layer in self.layers]

        # Masks are cached per shape and device, and apart for inference mode: a mask made under
        # torch.inference_mode() cannot enter a pass that autograd records (permanent hooks, such as a
        # planted mask, see both kinds of pass).
        masks: dict[tuple[int, torch.device, bool], torch.Tensor] = {}

        def make(heads: tuple[int, ...] | None) -> HookBody:
            def body(pattern: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
                n_q, n_k = pattern.shape[-2:]
                key = (n_q, pattern.device, torch.is_inference_mode_enabled())
                if key not in masks:
                    masks[key] = allowed_keys(n_q, self.mode, self.queries, self.keep_bos, pattern.device, self.n_last)
                if heads is None:
                    kept = pattern * masks[key]
                    return kept / kept.sum(dim=-1, keepdim=True)
                out = pattern.clone()
                kept = pattern[:, list(heads)] * masks[key]
                out[:, list(heads)] = kept / kept.sum(dim=-1, keepdim=True)
                return out

            return body

        return [(hooks.pattern(layer), make(self.heads_of(layer))) for layer in self.layers]


def head_sets(heads: Any, layers: tuple[int, ...]) -> Any:
    """:attr:`Peek.heads` normalised (see there): ``None``; a tuple of distinct heads; or, from a mapping
    ``{layer: heads}`` (or its spec form, a list of ``[layer, heads]`` pairs) whose blocks are exactly
    ``layers``, a tuple of ``(layer, heads)`` pairs sorted by layer."""
    if heads is None:
        return None
    if isinstance(heads, (str, bytes)) or not (isinstance(heads, Mapping) or hasattr(heads, "__iter__")):
        raise InterventionError(f"Peek heads={heads!r} must be a list of heads or a mapping {{layer: heads}}")
    items = list(heads.items()) if isinstance(heads, Mapping) else list(heads)
    per_layer = isinstance(heads, Mapping) or (items and all(isinstance(i, (list, tuple)) for i in items))

    def one(values: Any, where: str) -> tuple[int, ...]:
        out = to_tuple(values, f"Peek heads{where}")
        if not out or any(not isinstance(h, int) or isinstance(h, bool) or h < 0 for h in out):
            raise InterventionError(f"Peek heads{where}={list(out)!r} must be a non-empty list of integers >= 0")
        if len(set(out)) != len(out):
            raise InterventionError(f"Peek heads{where}={list(out)!r} lists a head twice")
        return out

    if not per_layer:
        return one(items, "")
    pairs = []
    for item in items:
        if len(item) != 2:
            raise InterventionError(f"Peek heads entry {item!r} must be a (layer, heads) pair")
        layer, values = item
        layer = int(layer) if isinstance(layer, str) and layer.isdigit() else layer
        pairs.append((layer, one(values, f" of layer {layer}")))
    if sorted(p[0] for p in pairs) != sorted(layers) or len(pairs) != len(layers):
        raise InterventionError(f"Peek heads name blocks {[p[0] for p in pairs]} but layers are {list(layers)}: give "
                                f"heads for exactly the blocks of layers (or leave layers empty)")
    return tuple(sorted(pairs))
