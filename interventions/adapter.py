"""One small adapter between the interventions and a TransformerLens model.

Everything model-specific (hook lookup, hook registration, which module sees the token ids, shapes)
goes through :class:`ModelAdapter`, so that a new backend (TransformerLens 4.x ``TransformerBridge``)
is an addition here, not a rewrite of the interventions. Backends register with
:func:`register_backend`; :func:`adapt` picks the first whose predicate accepts the model.

Hook names used by the toolkit (shared by TransformerLens 3.9 ``HookedTransformer`` and 4.x
``TransformerBridge``) are built by the helpers :func:`resid_post`, :func:`pattern` and :func:`z`.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .types import InterventionError


def resid_pre(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_mid"


def resid_post(layer: int) -> str:
    """Residual stream after block ``layer`` (0-indexed)."""
    return f"blocks.{layer}.hook_resid_post"


def pattern(layer: int) -> str:
    """Post-softmax attention pattern of block ``layer``: ``[batch, n_heads, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def z(layer: int) -> str:
    """Per-head attention output before ``W_O``: ``[batch, pos, n_heads, d_head]`` (query heads)."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out(layer: int) -> str:
    return f"blocks.{layer}.hook_attn_out"


def mlp_out(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"


@dataclass(frozen=True)
class ModelInfo:
    """Shapes of a model, as the interventions need them. All counts, 0-indexed where indices."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    parallel_attn_mlp: bool
    backend: str

    def check_layer(self, layer: int, what: str = "layer") -> None:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < self.n_layers:
            raise InterventionError(
                f"{what}={layer!r} is out of range: this model has {self.n_layers} blocks, "
                f"valid layers are 0..{self.n_layers - 1} (0-indexed)"
            )

    def check_head(self, layer: int, head: int) -> None:
        self.check_layer(layer, "head layer")
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < self.n_heads:
            raise InterventionError(
                f"head={head!r} of layer {layer} is out of range: valid query heads are "
                f"0..{self.n_heads - 1}"
            )

    def signature(self) -> dict[str, int]:
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "d_vocab": self.d_vocab,
        }


_levels = itertools.count(10_000)


def new_hook_level() -> int:
    """A fresh hook level: hooks added with it are removed together and touch no other hook."""
    return next(_levels)


class ModelAdapter:
    """Access to a TransformerLens ``HookedTransformer`` (3.x). Subclass for other backends."""

    backend = "hooked"

    def __init__(self, model: Any):
        self.model = model
        cfg = model.cfg
        self.info = ModelInfo(
            n_layers=int(cfg.n_layers),
            n_heads=int(cfg.n_heads),
            n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads),
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            d_vocab=int(cfg.d_vocab),
            n_ctx=int(cfg.n_ctx),
            parallel_attn_mlp=bool(getattr(cfg, "parallel_attn_mlp", False)),
            backend=self.backend,
        )

    # --- hooks -------------------------------------------------------------------------------
    def hook_point(self, name: str) -> Any:
        try:
            return self.model.hook_dict[name]
        except KeyError:
            raise InterventionError(
                f"hook point {name!r} does not exist on this {self.backend} model "
                f"({self.info.n_layers} blocks)"
            ) from None

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict

    def add_hook(self, name: str, fn: Callable[[torch.Tensor, Any], torch.Tensor | None], level: int) -> None:
        """Add ``fn(activation, hook)`` as a forward hook at ``name``, tagged with ``level``."""
        self.hook_point(name).add_hook(fn, dir="fwd", level=level)

    def remove_hooks(self, names: list[str], level: int) -> None:
        for name in set(names):
            self.hook_point(name).remove_hooks("fwd", level=level)

    def token_module(self) -> torch.nn.Module:
        """The module whose forward receives the token ids ``[batch, pos]`` of each forward pass."""
        return self.model.embed

    def register_forward_pre_hook(self, fn: Callable[..., Any]) -> Any:
        return self.model.register_forward_pre_hook(fn, with_kwargs=True)

    # --- identity and running ----------------------------------------------------------------
    def embedding_matrix(self) -> torch.Tensor:
        return self.model.W_E

    def fingerprint(self) -> str:
        """A short hash of (a sample of) the embedding matrix: tells two models of one shape apart."""
        w = self.embedding_matrix().detach()
        stride = max(1, w.shape[0] // 64)
        sample = w[::stride][:64].to(device="cpu", dtype=torch.float32).contiguous()
        return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]

    def run_to_resid(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run every block but skip the final norm and unembedding (saves the vocab projection)."""
        return self.model(tokens, stop_at_layer=self.info.n_layers)

    def device(self) -> torch.device:
        return self.embedding_matrix().device

    def dtype(self) -> torch.dtype:
        return self.embedding_matrix().dtype


_BACKENDS: list[tuple[Callable[[Any], bool], type[ModelAdapter]]] = []


def register_backend(predicate: Callable[[Any], bool], adapter_cls: type[ModelAdapter]) -> None:
    """Register an adapter class for models accepted by ``predicate`` (checked newest first)."""
    _BACKENDS.insert(0, (predicate, adapter_cls))


def _is_hooked_transformer(model: Any) -> bool:
    try:
        from transformer_lens import HookedTransformer
    except ImportError:  # TransformerLens 4.x removed it
        return False
    return isinstance(model, HookedTransformer)


register_backend(_is_hooked_transformer, ModelAdapter)


def adapt(model: Any) -> ModelAdapter:
    """The adapter for ``model``; raises ``TypeError`` for objects no backend accepts."""
    if isinstance(model, ModelAdapter):
        return model
    for predicate, cls in _BACKENDS:
        if predicate(model):
            return cls(model)
    raise TypeError(
        f"expected a TransformerLens model (HookedTransformer or TransformerBridge), got "
        f"{type(model).__name__}"
    )
