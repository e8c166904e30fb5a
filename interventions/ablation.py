"""Residual-stream ablations at ``blocks.{layer}.hook_resid_post``: CAMA and its baselines.

``layer`` is the 0-indexed block *after* which the residual stream is replaced; for the AF1
analysis it is ``L_wait``, the last waiting block. Position 0 (BOS) is never replaced unless a
baseline is given explicit ``positions`` that include it.

Hooks hold plain values and tensors (one block's means), never the intervention or its whole cache: a
remote backend sends the hooks with each request (code by value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from . import adapter as hooks
from .adapter import ModelInfo
from .base import ForwardContext, HookBody, Intervention, to_tuple
from .cache import MeanCache
from .hooks import HookPointLike
from .types import InterventionError
from .validation import check_int

if TYPE_CHECKING:
    from jaxtyping import Float


def _check_cache(cache: object, who: str) -> None:
    if not isinstance(cache, MeanCache):
        raise InterventionError(f"{who} needs a MeanCache (from MeanCache.fit), got {type(cache).__name__}")


def on_device(values: Float[torch.Tensor, "*shape"]) -> Callable[[Float[torch.Tensor, "*like"]],
                                                                 Float[torch.Tensor, "*shape"]]:
    """``copy(like)``: ``values`` on the device and in the dtype of tensor ``like`` (copies memoised)."""
    copies: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def copy(like: Float[torch.Tensor, "*like"]) -> Float[torch.Tensor, "*shape"]:
        key = (like.device, like.dtype)
        if key not in copies:
            copies[key] = values.to(device=like.device, dtype=like.dtype)
        return copies[key]

    return copy


def _positions(positions: tuple[int, ...] | None, n_pos: int, who: str) -> list[int] | slice:
    if positions is None:
        return slice(1, None)
    out = []
    for p in positions:
        if not -n_pos <= p < n_pos:
            raise InterventionError(
                f"{who}: position {p} is out of range for prompts of {n_pos} tokens "
                f"(valid 0..{n_pos - 1} or negative from the end)"
            )
        out.append(p % n_pos)
    return out


@dataclass(frozen=True)
class CAMA(Intervention):
    """Context-aware mean ablation after block ``layer`` (0-indexed; ``L_wait`` in AF1).

    For every prompt ``b`` and position ``t >= 1`` the residual ``blocks.{layer}.hook_resid_post``
    becomes ``cache.mean(layer, t, token=tokens[b, t])``: the mean over fit prompts with the same token
    at the same position. The tokens are those of the running forward pass. Unseen ``(t, token)``
    pairs and prompt lengths other than the fit layout raise; there is no fallback.
    """

    cache: MeanCache = field(repr=True, compare=True)
    layer: int = 0
    uses_tokens = True

    def __post_init__(self) -> None:
        _check_cache(self.cache, "CAMA")
        check_int("CAMA layer", self.layer)
        self.cache.check_layer(self.layer)

    def validate(self, info: ModelInfo) -> None:
        info.check_layer(self.layer, "CAMA layer")

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        # The hook holds this block's means and the entry lookup only (what a remote request carries).
        index, table = self.cache.indexer(), on_device(self.cache.layer("cond_mean", self.layer))

        def body(resid: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            idx = index(ctx.require_tokens("CAMA"))
            out = resid.clone()
            out[:, 1:] = table(resid)[idx[:, 1:].to(resid.device)]
            return out

        return [(hooks.resid_post(self.layer), body)]


@dataclass(frozen=True)
class MeanAblation(Intervention):
    """Plain mean ablation after block ``layer``: each position gets its mean over all fit prompts.

    ``positions=None`` replaces every position except BOS (position 0); otherwise the listed ones.
    Unlike CAMA this also erases the token's own identity (a baseline for comparison).
    """

    cache: MeanCache
    layer: int = 0
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        _check_cache(self.cache, "MeanAblation")
        check_int("MeanAblation layer", self.layer)
        self.cache.check_layer(self.layer)
        if self.positions is not None:
            object.__setattr__(self, "positions", to_tuple(self.positions, "positions"))

    def validate(self, info: ModelInfo) -> None:
        info.check_layer(self.layer, "MeanAblation layer")

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        fit_pos, positions = self.cache.n_pos, self.positions
        table = on_device(self.cache.layer("pos_mean", self.layer))

        def body(resid: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            n_pos = resid.shape[1]
            if n_pos != fit_pos:
                raise InterventionError(
                    f"MeanAblation: prompt length {n_pos} differs from the cache's fit layout of "
                    f"{fit_pos} tokens"
                )
            sel = _positions(positions, n_pos, "MeanAblation")
            means = table(resid)
            out = resid.clone()
            out[:, sel] = means[sel]
            return out

        return [(hooks.resid_post(self.layer), body)]


@dataclass(frozen=True)
class ZeroAblation(Intervention):
    """Zero the residual stream after block ``layer`` (``positions=None``: every position but BOS)."""

    layer: int = 0
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_int("ZeroAblation layer", self.layer)
        if self.positions is not None:
            object.__setattr__(self, "positions", to_tuple(self.positions, "positions"))

    def validate(self, info: ModelInfo) -> None:
        info.check_layer(self.layer, "ZeroAblation layer")

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        positions = self.positions

        def body(resid: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            sel = _positions(positions, resid.shape[1], "ZeroAblation")
            out = resid.clone()
            out[:, sel] = 0.0
            return out

        return [(hooks.resid_post(self.layer), body)]
