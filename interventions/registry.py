"""Which adapter drives which model: the shipped backends and any registered later.

:func:`adapt` returns the :class:`~interventions.adapter.ModelAdapter` of a model: the first registered
``(predicate, adapter class)`` whose predicate accepts it, newest registration first, then the shipped backends
(nnsight, ``HookedTransformer``, ``TransformerBridge``). A further backend is one module that subclasses
:class:`~interventions.adapter.ModelAdapter` and calls :func:`register_backend` once it is imported. This module
sits above :mod:`interventions.adapter` and :mod:`interventions.backends`, so neither imports the other's
registrations back.
"""

from __future__ import annotations

from collections.abc import Callable

from .adapter import ModelAdapter
from .backends.bridge import BridgeAdapter, is_bridge
from .backends.hooked import HookedAdapter, is_hooked_transformer
from .backends.nnsight import NNsightAdapter, is_nnsight_model
from .types import Model

__all__ = ["adapt", "register_backend", "registered"]

REGISTERED: list[tuple[Callable[[Model], bool], type[ModelAdapter]]] = [
    (is_nnsight_model, NNsightAdapter), (is_hooked_transformer, HookedAdapter), (is_bridge, BridgeAdapter),
]
"""``(predicate, adapter class)`` pairs in the order :func:`adapt` tries them."""


def register_backend(predicate: Callable[[Model], bool], adapter_cls: type[ModelAdapter]) -> None:
    """Register an adapter class for models accepted by ``predicate``, tried before every earlier one."""
    REGISTERED.insert(0, (predicate, adapter_cls))


def registered() -> list[type[ModelAdapter]]:
    """The registered adapter classes, in the order :func:`adapt` tries them."""
    return [cls for _, cls in REGISTERED]


def adapt(model: Model) -> ModelAdapter:
    """The adapter for ``model`` (``model`` itself if it already is one); ``TypeError`` for an object no registered
    backend accepts."""
    if isinstance(model, ModelAdapter):
        return model
    for predicate, cls in REGISTERED:
        if predicate(model):
            return cls(model)
    raise TypeError(
        f"expected a TransformerLens model (HookedTransformer or TransformerBridge) or an nnsight model "
        f"(interventions.backends.nnsight.NNsightModel), got "
        f"{type(model).__name__}: pass one of those, or register an adapter with interventions.register_backend"
    )
