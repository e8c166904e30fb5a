"""Deprecated: the ``TransformerBridge`` names under their former import path.

The code lives in :mod:`interventions.backends.bridge` (the adapter, ``boot``), :mod:`interventions.convert`
(weights: ``bridge_from_hooked_state``, ``hooked_state_to_hf``, ``with_unembed_bias``) and
:mod:`interventions.tokenization` (``make_word_tokenizer``, ``prepare_tokenizer``); every name importable from
here before stays importable, with a ``DeprecationWarning`` on import.
"""

from __future__ import annotations

import warnings

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

warnings.warn(
    "interventions.bridge is deprecated: import from interventions.backends.bridge (BridgeAdapter, boot, is_bridge, "
    "transformer_lens_major), interventions.convert (bridge_from_hooked_state, hooked_state_to_hf, "
    "with_unembed_bias, ARCHES) or interventions.tokenization (make_word_tokenizer, prepare_tokenizer)",
    DeprecationWarning,
    stacklevel=2,
)
