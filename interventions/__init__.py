"""Intervention primitives that change a TransformerLens forward pass.

>>> import interventions as iv
>>> cache = iv.MeanCache.fit(model, tokens)             # doctest: +SKIP
>>> logits = iv.run(model, tokens, [iv.CAMA(cache, layer=3), iv.Peek([4, 5], "self", "all")])  # doctest: +SKIP

Conventions: blocks are 0-indexed; ``layer`` of CAMA / MeanAblation / ZeroAblation is the block after
which the residual stream (``blocks.{layer}.hook_resid_post``) is replaced; position 0 holds BOS and is
never ablated by default; ``Peek`` keeps BOS and self for restricted rows.

Backends: TransformerLens 3.9 ``HookedTransformer``, ``TransformerBridge`` (TransformerLens 4.x, and
the 3.9 preview) and a Hugging Face model in nnsight (local or on NDIF; the ``nnsight`` extra); see
``docs/backends.md`` and ``docs/remote.md``.
"""

from .ablation import CAMA, MeanAblation, ZeroAblation
from .adapter import BACKENDS, Capabilities, ModelAdapter, ModelInfo, adapt, register_backend, resolve_backend
from .af1 import af1_subgraph
from .apply import apply, run, run_many
from . import bridge  # noqa: F401  (the historical module path interventions.bridge)
from .backends import BridgeAdapter, HookedAdapter, NNsightAdapter  # registers the shipped backends (no nnsight import)
from .convert import bridge_from_hooked, bridge_from_hooked_state
from .base import REGISTRY, Intervention
from .cache import MeanCache
from .heads import HeadAblation
from .peek import Peek, allowed_keys
from .types import CacheMismatchError, InterventionError, InterventionNotAppliedError

__all__ = [
    "BACKENDS",
    "BridgeAdapter",
    "CAMA",
    "CacheMismatchError",
    "Capabilities",
    "HeadAblation",
    "HookedAdapter",
    "Intervention",
    "InterventionError",
    "InterventionNotAppliedError",
    "MeanAblation",
    "MeanCache",
    "ModelAdapter",
    "ModelInfo",
    "NNsightAdapter",
    "Peek",
    "REGISTRY",
    "ZeroAblation",
    "adapt",
    "af1_subgraph",
    "allowed_keys",
    "apply",
    "resolve_backend",
    "bridge_from_hooked",
    "bridge_from_hooked_state",
    "register_backend",
    "run",
    "run_many",
]
