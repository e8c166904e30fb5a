"""The ``TransformerBridge`` backend and the conversion from ``HookedTransformer`` weights, under their
historical import path.

The code lives in :mod:`interventions.backends.bridge` (the adapter), :mod:`interventions.convert`
(weights) and :mod:`interventions.tokenization`; every name importable from here before stays
importable.
"""

from __future__ import annotations

from .backends.bridge import (
    BridgeAdapter,
    StopForward,
    boot,
    is_bridge,
    native_start_at_layer,
    transformer_lens_major,
)
from .convert import ARCHES, bridge_from_hooked, bridge_from_hooked_state, hooked_state_to_hf, with_unembed_bias
from .tokenization import make_word_tokenizer, prepare_tokenizer

__all__ = [
    "ARCHES", "BridgeAdapter", "StopForward", "boot", "bridge_from_hooked", "bridge_from_hooked_state",
    "hooked_state_to_hf", "is_bridge", "make_word_tokenizer", "native_start_at_layer", "prepare_tokenizer",
    "transformer_lens_major", "with_unembed_bias",
]
