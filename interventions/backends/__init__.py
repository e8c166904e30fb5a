"""The shipped backends; importing this package registers their adapters with
:func:`interventions.adapter.register_backend`.

* :mod:`.hooked`: TransformerLens 3.x ``HookedTransformer`` (:class:`~.hooked.HookedAdapter`).
* :mod:`.bridge`: ``TransformerBridge`` of TransformerLens 4.x and the 3.9 preview
  (:class:`~.bridge.BridgeAdapter`).

A further backend is one module that subclasses :class:`interventions.adapter.ModelAdapter`, declares
its :class:`~interventions.adapter.Capabilities` and calls ``register_backend(predicate, cls)``;
import it here (or anywhere before :func:`interventions.adapt` is called).
"""

from . import bridge, hooked  # noqa: F401  (registration)
from .bridge import BridgeAdapter
from .hooked import HookedAdapter

__all__ = ["BridgeAdapter", "HookedAdapter"]
