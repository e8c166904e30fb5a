"""The intervention protocol: small frozen dataclasses that declare hooks, plus their registry.

An intervention is data (printable, comparable, serialisable with :meth:`Intervention.to_dict`).
:func:`interventions.apply` turns it into forward hooks for one model through :meth:`Intervention.hooks`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from jaxtyping import Int

from .adapter import ModelInfo
from .cache import MeanCache
from .hooks import HookPointLike
from .types import InterventionError, JsonDict, JsonMapping

HookBody = Callable[[torch.Tensor, HookPointLike | None], "torch.Tensor | None"]

REGISTRY: dict[str, type[Intervention]] = {}

OMIT_DEFAULT = "omit_default"
"""``dataclasses.field(metadata={OMIT_DEFAULT: True})``: left out of specs and reprs at its default."""


class ForwardContext:
    """What hooks may know about the forward pass that is running: its token ids."""

    def __init__(self, tokens: Int[torch.Tensor, "batch pos"] | None = None):
        self.fixed_tokens = tokens
        self.tokens: Int[torch.Tensor, "batch pos"] | None = tokens
        self.n_forwards = 0

    def require_tokens(self, who: str) -> Int[torch.Tensor, "batch pos"]:
        if self.tokens is None:
            raise InterventionError(
                f"{who} needs the token ids of the forward pass, but none were seen: call the model "
                f"on token ids, or pass tokens=... to interventions.apply when starting from a residual"
            )
        return self.tokens


@dataclass(frozen=True)
class Intervention:
    """Base class. Subclasses are frozen dataclasses and implement :meth:`validate` and :meth:`hooks`."""

    uses_tokens: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        REGISTRY[cls.__name__] = cls

    def validate(self, info: ModelInfo) -> None:
        """Raise :class:`InterventionError` if this intervention does not fit a model of ``info``."""

    def hooks(self, ctx: ForwardContext, info: ModelInfo) -> list[tuple[str, HookBody]]:
        """``(hook name, body)`` pairs; a body gets ``(activation, hook)`` and returns the replacement."""
        raise NotImplementedError

    def mask_hooks(self, info: ModelInfo) -> list[tuple[str, HookBody]] | None:
        """The intervention as edits of per-block attention masks (``blocks.{l}.attn.hook_attn_mask``,
        boolean ``[query_pos, key_pos]``, True = may attend), for backends whose attention takes masks;
        ``None`` (the default) when it has no mask form."""
        return None

    # --- specs -------------------------------------------------------------------------------
    def spec_fields(self) -> list[dataclasses.Field]:
        """The fields a spec and the repr show: all, except a field added later (``metadata`` key
        :data:`OMIT_DEFAULT`) while it holds its default, so specs written before it existed stay the same."""
        return [f for f in dataclasses.fields(self)
                if not (f.metadata.get(OMIT_DEFAULT) and getattr(self, f.name) == f.default)]

    def to_dict(self) -> JsonDict:
        """JSON-serialisable spec. A cache is referenced by its content hash and file path."""
        out: JsonDict = {"type": type(self).__name__}
        for f in self.spec_fields():
            value = getattr(self, f.name)
            if isinstance(value, MeanCache):
                value = {"sha256": value.sha256, "path": value.source}
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
        return out

    @staticmethod
    def from_dict(spec: JsonMapping, cache: MeanCache | None = None) -> Intervention:
        """Rebuild an intervention from :meth:`to_dict` output.

        A spec that references a cache uses ``cache`` when given (its hash must match), else loads the
        file at the recorded path and checks its hash.
        """
        spec = dict(spec)
        kind = spec.pop("type", None)
        if kind not in REGISTRY:
            raise InterventionError(f"unknown intervention type {kind!r}: known types are {sorted(REGISTRY)}")
        cls = REGISTRY[kind]
        import dataclasses

        if dataclasses.is_dataclass(cls):
            known = {f.name for f in dataclasses.fields(cls) if f.init}
            unknown = sorted(set(spec) - known)
            if unknown:
                raise InterventionError(f"{kind} spec has unknown field(s) {', '.join(map(str, unknown))}; known: "
                                        f"{', '.join(sorted(known))}")
        ref = spec.get("cache")
        if isinstance(ref, dict):
            if cache is None:
                if not ref.get("path"):
                    raise InterventionError(f"{kind} spec references a cache without a path: pass cache=...")
                if not ref.get("sha256"):
                    raise InterventionError(f"{kind} spec references cache file {ref['path']} without its sha256: "
                                            f"a file that cannot be checked is not loaded; pass cache=...")
                cache = MeanCache.load(Path(ref["path"]))
            if ref.get("sha256") and cache.sha256 != ref["sha256"]:
                raise InterventionError(
                    f"{kind} spec references cache {ref['sha256'][:12]} but got {cache.sha256[:12]}"
                )
            spec["cache"] = cache
        return cls(**spec)


def to_tuple(values: Any, what: str) -> tuple:
    """Normalise a list-like field to a tuple (so frozen dataclasses stay hashable and comparable)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InterventionError(f"{what} must be a list, got {values!r}")
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)
