"""Former module paths of :mod:`circuits`, kept importable with a ``DeprecationWarning``.

The package is organised in folders by concern (``tasks/``, ``prompts/``, ``models/``, ``store/``,
``groundtruth/``; ``docs/architecture.md``). A module that lived at the top level before, e.g.
``circuits.task_files``, still imports under its old name: the import warns once and returns the module that
holds the code now (the same module object, so attributes set on it reach the code that uses them). An old path
whose code is now split over several modules (``circuits.specs``, ``circuits.loading``) returns a module that
forwards each name to the module holding it.

:func:`install` puts the finder in front of :data:`sys.meta_path`; :mod:`circuits` calls it on import. Nothing
inside the package imports an old path (``tests/test_architecture.py`` checks that).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

MOVED: dict[str, tuple[str, ...]] = {
    "circuits.task_files": ("circuits.tasks.files",),
    "circuits.task_checks": ("circuits.tasks.checks",),
    "circuits.task_tokens": ("circuits.tasks.tokens",),
    "circuits.operand_space": ("circuits.tasks.operand_space",),
    "circuits.digits": ("circuits.tasks.digits",),
    "circuits.formats": ("circuits.tasks.formats",),
    "circuits.package_data": ("circuits.tasks.package_data",),
    "circuits.prompt_data": ("circuits.prompts.datasets",),
    "circuits.fitset": ("circuits.prompts.fitset",),
    "circuits.prepared": ("circuits.prompts.prepared",),
    "circuits.specs": ("circuits.models.spec", "circuits.prompts.spec"),
    "circuits.loading": ("circuits.models.loading", "circuits.models.hub", "circuits.prompts.sampling"),
    "circuits.backend_loaders": ("circuits.models.loaders",),
    "circuits.local_models": ("circuits.models.local",),
    "circuits.gguf": ("circuits.models.gguf",),
    "circuits.model_names": ("circuits.models.names", "circuits.models.hub"),
    "circuits.placement": ("circuits.models.placement",),
    "circuits.memory": ("circuits.models.memory",),
    "circuits.runs": ("circuits.store.runs",),
    "circuits.records": ("circuits.store.records",),
    "circuits.lock": ("circuits.store.lock",),
    "circuits.atomic": ("circuits.store.atomic",),
    "circuits.files": ("circuits.store.files",),
    "circuits.outcomes": ("circuits.store.outcomes",),
    "circuits.frames": ("circuits.store.frames",),
    "circuits.groundtruth_report": ("circuits.groundtruth.report",),
    "circuits.attribution": ("circuits.prune.attribution",),
    "circuits.lens_report": ("circuits.lens.report",),
    "circuits.lens.interchange": ("circuits.lens.interchange_check",),
}
"""Old module path -> the module(s) holding its code now (the first one for a single module)."""

CALLABLE: dict[str, str] = {"circuits.lens.interchange": "interchange"}
"""Old module paths whose last part is also the name of a function its package exports: importing the old path
binds it on the package (the import system does), so the module it gives is callable as that function, and
``circuits.lens.interchange(...)`` keeps working after ``import circuits.lens.interchange``."""


def warn(old: str, new: Sequence[str]) -> None:
    """The one deprecation message of an old path (``stacklevel`` points at the import statement's frame
    as well as the import system allows)."""
    warnings.warn(f"{old} is deprecated: import from {' or '.join(new)} (the module moved; the old path will be "
                  f"removed in a later release)", DeprecationWarning, stacklevel=3)


class Forwarding(types.ModuleType):
    """An old module whose names now live in several modules: each attribute is read from the first that has it."""

    def __init__(self, name: str, targets: Sequence[str]):
        super().__init__(name, f"Deprecated: {name} moved to {', '.join(targets)}.")
        self.targets = tuple(targets)

    def __getattr__(self, attr: str) -> object:
        for target in self.targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r} (it moved to "
                             f"{', '.join(self.targets)})")


class CallableForwarding(Forwarding):
    """A :class:`Forwarding` module that is also the function its package exports under the same name."""

    def __init__(self, name: str, targets: Sequence[str], function: str):
        super().__init__(name, targets)
        self.function = function

    def __call__(self, *args: object, **kwargs: object) -> object:
        return getattr(self, self.function)(*args, **kwargs)


class MovedLoader(importlib.abc.Loader):
    """Returns the module at the new path (one target) or a :class:`Forwarding` module (several)."""

    def __init__(self, old: str, targets: Sequence[str]):
        self.old, self.targets = old, tuple(targets)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warn(self.old, self.targets)
        if self.old in CALLABLE:
            return CallableForwarding(self.old, self.targets, CALLABLE[self.old])
        if len(self.targets) == 1:
            return importlib.import_module(self.targets[0])
        return Forwarding(self.old, self.targets)

    def exec_module(self, module: types.ModuleType) -> None:
        sys.modules[self.old] = module  # the import system stores what create_module returned


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED`; everything else is left to the other finders."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        targets = MOVED.get(fullname)
        if targets is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, MovedLoader(fullname, targets))


def install() -> None:
    """Put :class:`MovedFinder` first in :data:`sys.meta_path` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
