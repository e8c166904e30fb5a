"""Last-position residual states after every attention and MLP sub-layer, captured with scoped hooks.

Which state follows each sub-layer (blocks 0-indexed):

* Sequential blocks (GPT-2, Llama, ...): post-attention = ``blocks.{l}.hook_resid_mid``, post-MLP =
  ``blocks.{l}.hook_resid_post``.
* Parallel blocks (GPT-NeoX/Pythia, GPT-J: ``cfg.parallel_attn_mlp``) have no ``hook_resid_mid``;
  post-attention = ``hook_resid_pre + hook_attn_out``; post-MLP = ``hook_resid_post`` (= pre + attn + mlp).
* Attention-only models have one sub-layer per block (``"attn"`` = ``hook_resid_post``).

Hooks copy only ``act[:, -1]`` (the last prompt position), so a pass keeps ``[batch, d_model]`` per hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int

import interventions as iv
from interventions.adapter import ModelAdapter, attn_out, resid_mid, resid_post, resid_pre
from interventions.hooks import HookPointLike
from interventions.types import Model

__all__ = ["SUBLAYERS", "sublayers_of", "sublayer_hooks", "block_list", "capture_last", "lens_states"]

SUBLAYERS = ("attn", "mlp")


def sublayers_of(model: Model) -> tuple[str, ...]:
    """Sub-layers decoded per block: ``("attn", "mlp")``, or ``("attn",)`` for attention-only models."""
    return ("attn",) if getattr(model.cfg, "attn_only", False) else SUBLAYERS


def sublayer_hooks(model: Model, layer: int) -> dict[str, tuple[str, ...]]:
    """Hook names whose last-position sum is the state after each sub-layer of block ``layer``."""
    if getattr(model.cfg, "attn_only", False):
        return {"attn": (resid_post(layer),)}
    if getattr(model.cfg, "parallel_attn_mlp", False):
        return {"attn": (resid_pre(layer), attn_out(layer)), "mlp": (resid_post(layer),)}
    return {"attn": (resid_mid(layer),), "mlp": (resid_post(layer),)}


def block_list(ad: ModelAdapter, layers: Sequence[int] | None) -> list[int]:
    """``layers`` as a list of checked block indices (0-indexed); None means every block in order."""
    blocks = list(range(ad.info.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in blocks:
        ad.info.check_layer(layer)
    return blocks


def capture_last(ad: ModelAdapter, names: Sequence[str], forward: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Run ``forward()`` with hooks copying the last position (``act[:, -1]``) of each hook in
    ``names``; returns ``{name: [batch, ...]}`` for the hooks that fired, keyed by the names asked for
    (a bridge's hook point may carry its own, aliased name). The hooks are gone when it returns."""
    store: dict[str, torch.Tensor] = {}

    def grabber(name: str) -> Any:
        def grab(act: torch.Tensor, hook: HookPointLike | None = None) -> None:
            store[name] = act[:, -1].detach().clone()

        return grab

    with ad.hooks([(name, grabber(name)) for name in names]):
        forward()
    return store


@torch.inference_mode()
def lens_states(
    model: Model, tokens: Int[torch.Tensor, "batch pos"], layers: Sequence[int] | None = None
) -> dict[tuple[int, str], Float[torch.Tensor, "batch d_model"]]:
    """Residual states at the last position after every sub-layer of ``layers`` (default: all blocks).

    One forward pass (without the final unembedding); hooks copy only ``act[:, -1]``. Keys are
    ``(layer, sublayer)`` with 0-indexed blocks and sub-layers from :func:`sublayers_of`.
    """
    ad: ModelAdapter = iv.adapt(model)
    layers = block_list(ad, layers)
    plan = {(layer, sub): names for layer in layers for sub, names in sublayer_hooks(model, layer).items()}
    names = sorted({n for ns in plan.values() for n in ns})
    store = capture_last(ad, names, lambda: ad.run_to_resid(tokens))
    missing = [n for n in names if n not in store]
    if missing:
        raise RuntimeError(f"hooks {missing} did not fire: this architecture is not supported by the lens")
    states = {}
    for key, ns in plan.items():
        state = store[ns[0]]
        for n in ns[1:]:  # parallel blocks: resid_pre + attn_out
            state = state + store[n]
        states[key] = state
    return states
