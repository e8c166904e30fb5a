"""The shipped backends; :mod:`interventions.registry` registers their adapters.

* :mod:`.hooked`: TransformerLens 3.x ``HookedTransformer`` (:class:`~.hooked.HookedAdapter`).
* :mod:`.bridge`: ``TransformerBridge`` of TransformerLens 4.x and the 3.9 preview
  (:class:`~.bridge.BridgeAdapter`).
* :mod:`.nnsight`: a Hugging Face causal LM in nnsight, locally or on NDIF
  (:class:`~.nnsight.NNsightAdapter`; nnsight itself is imported only when such a model is built).

A further backend is one module that subclasses :class:`interventions.adapter.ModelAdapter`, declares
its :class:`~interventions.adapter.Capabilities` and calls
:func:`interventions.registry.register_backend` ``(predicate, cls)`` before :func:`interventions.adapt` is called.
"""

from .bridge import BridgeAdapter
from .hooked import HookedAdapter
from .nnsight import NNsightAdapter

__all__ = ["BridgeAdapter", "HookedAdapter", "NNsightAdapter"]
