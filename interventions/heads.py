"""Head ablation: replace chosen query heads' outputs ``blocks.{l}.attn.hook_z`` (before ``W_O``)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from jaxtyping import Bool

from . import adapter as hooks
from .ablation import on_device
from .adapter import ModelInfo
from .base import ForwardContext, HookBody, Intervention, to_tuple
from .cache import MeanCache
from .hooks import HookPointLike
from .types import Head, InterventionError
from .validation import check_choice
from .vocab import HEAD_METHODS, HeadMethod


@dataclass(frozen=True)
class HeadAblation(Intervention):
    """Remove ``heads`` (``(layer, head)`` pairs, 0-indexed query heads).

    ``method="zero"`` writes zeros into ``hook_z``; ``method="mean"`` writes the cache's per-position
    mean of that head's ``hook_z`` (prompts must then have the cache's fit length).
    """

    heads: tuple[Head, ...] = ()
    method: HeadMethod = "zero"
    cache: MeanCache | None = None

    def __post_init__(self) -> None:
        heads = to_tuple(self.heads, "heads")
        for h in heads:
            if (
                not isinstance(h, tuple)
                or len(h) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in h)
            ):
                raise InterventionError(f"head {h!r} must be a (layer, head) pair of integers >= 0")
        if len(set(heads)) != len(heads):
            raise InterventionError("HeadAblation lists a head twice")
        object.__setattr__(self, "heads", heads)
        check_choice("HeadAblation method", self.method, HEAD_METHODS)
        if self.method == "mean" and not isinstance(self.cache, MeanCache):
            raise InterventionError("HeadAblation(method='mean') needs cache=MeanCache.fit(model, tokens)")

    def validate(self, info: ModelInfo) -> None:
        for layer, head in self.heads:
            info.check_head(layer, head)

    def by_layer(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for layer, head in self.heads:
            out[layer].append(head)
        return dict(sorted(out.items()))

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        def make(layer: int, heads: list[int]) -> HookBody:
            # The hook holds this block's head means only (what a remote request carries).
            cache = self.cache
            fit_pos = cache.n_pos if cache is not None else 0
            table = on_device(cache.layer("z_mean", layer)) if cache is not None and self.method == "mean" else None

            def body(z: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
                out = z.clone()
                if table is None:
                    out[:, :, heads] = 0.0
                    return out
                if z.shape[1] != fit_pos:
                    raise InterventionError(
                        f"HeadAblation(method='mean'): prompt length {z.shape[1]} differs from the "
                        f"cache's fit layout of {fit_pos} tokens"
                    )
                out[:, :, heads] = table(z)[:, heads]
                return out

            return body

        return [(hooks.z(layer), make(layer, heads)) for layer, heads in self.by_layer().items()]


@dataclass(frozen=True)
class HeadAblationGroups(Intervention):
    """Several head ablations in one forward pass: the batch is ``len(groups)`` equal blocks of rows (block
    ``i`` = rows ``i * b .. (i + 1) * b - 1`` for a batch of ``len(groups) * b``), and block ``i`` has the heads
    ``groups[i]`` removed exactly as :class:`HeadAblation` removes them (``method="zero"``: zeros in ``hook_z``;
    ``"mean"``: the cache's per-position means). Same numbers as one pass per group with
    ``HeadAblation(groups[i])`` over the same prompts; a group may be empty (nothing removed)."""

    groups: tuple[tuple[Head, ...], ...] = ()
    method: HeadMethod = "zero"
    cache: MeanCache | None = None

    def __post_init__(self) -> None:
        groups = tuple(tuple(HeadAblation(heads=g, method=self.method, cache=self.cache).heads)
                       for g in to_tuple(self.groups, "groups"))
        if not groups:
            raise InterventionError("HeadAblationGroups needs at least one group of heads")
        object.__setattr__(self, "groups", groups)

    def validate(self, info: ModelInfo) -> None:
        for group in self.groups:
            for layer, head in group:
                info.check_head(layer, head)

    def masks(self, n_heads: int) -> dict[int, Bool[torch.Tensor, "groups n_heads"]]:
        """Per layer with any removed head: ``[groups, n_heads]``, true where that group removes that head."""
        out: dict[int, torch.Tensor] = {}
        for i, group in enumerate(self.groups):
            for layer, head in group:
                out.setdefault(layer, torch.zeros(len(self.groups), n_heads, dtype=torch.bool))[i, head] = True
        return dict(sorted(out.items()))

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        n_groups = len(self.groups)

        def make(layer: int, mask: torch.Tensor) -> HookBody:
            cache = self.cache
            fit_pos = cache.n_pos if cache is not None else 0
            table = on_device(cache.layer("z_mean", layer)) if cache is not None and self.method == "mean" else None

            def body(z: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
                if z.shape[0] % n_groups:
                    raise InterventionError(f"HeadAblationGroups: a batch of {z.shape[0]} rows does not split into "
                                            f"{n_groups} equal groups")
                rows = mask.to(z.device).repeat_interleave(z.shape[0] // n_groups, dim=0)[:, None, :, None]
                if table is None:
                    return z.masked_fill(rows, 0.0)
                if z.shape[1] != fit_pos:
                    raise InterventionError(
                        f"HeadAblationGroups(method='mean'): prompt length {z.shape[1]} differs from the "
                        f"cache's fit layout of {fit_pos} tokens"
                    )
                return torch.where(rows, table(z)[None], z)

            return body

        return [(hooks.z(layer), make(layer, mask)) for layer, mask in self.masks(info.n_heads).items()]
