"""Intervention primitives that change a TransformerLens forward pass.

>>> import interventions as iv
>>> cache = iv.MeanCache.fit(model, tokens)             # doctest: +SKIP
>>> logits = iv.run(model, tokens, [iv.CAMA(cache, layer=3), iv.Peek([4, 5], "self", "all")])  # doctest: +SKIP

Conventions: blocks are 0-indexed; ``layer`` of CAMA / MeanAblation / ZeroAblation is the block after
which the residual stream (``blocks.{layer}.hook_resid_post``) is replaced; position 0 holds BOS and is
never ablated by default; ``Peek`` keeps BOS and self for restricted rows (in every head of its blocks, or in
the query heads ``heads=`` names). A ``(position, token)`` a ``MeanCache`` lacks raises ``UncoveredEntryError``
(a ``CacheMismatchError``) naming the token as text; ``MeanCache.coverage`` / ``covers`` / ``extend`` show and
fill what is missing.

Backends: TransformerLens 3.9 ``HookedTransformer``, ``TransformerBridge`` (TransformerLens 4.x, and
the 3.9 preview) and a Hugging Face model in nnsight (local or on NDIF; the ``nnsight`` extra); see
``docs/backends.md`` and ``docs/remote.md``.
"""

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "CAMA": "ablation", "MeanAblation": "ablation", "ZeroAblation": "ablation",
    "BACKENDS": "vocab", "Capabilities": "adapter", "ModelAdapter": "adapter", "ModelInfo": "adapter",
    "adapt": "registry", "register_backend": "registry", "resolve_backend": "adapter",
    "af1_subgraph": "af1", "apply": "forward", "run": "forward", "run_many": "forward",
    "BridgeAdapter": "backends", "HookedAdapter": "backends", "NNsightAdapter": "backends",
    "bridge_from_hooked": "convert", "bridge_from_hooked_state": "convert",
    "REGISTRY": "base", "Intervention": "base", "MeanCache": "cache", "HeadAblation": "heads",
    "HeadAblationGroups": "heads",
    "Peek": "peek", "allowed_keys": "peek",
    "CacheMismatchError": "errors", "InterventionError": "errors", "InterventionNotAppliedError": "errors",
    "UncoveredEntryError": "entries",
}
"""Public name -> its module; names are imported on first use, so ``import interventions`` (and the
vocabulary in :mod:`interventions.vocab`) costs no torch import."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"interventions.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"interventions.{name}")  # submodules: iv.adapter, iv.backends, ...
    except ModuleNotFoundError:
        raise AttributeError(f"module 'interventions' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return __all__
