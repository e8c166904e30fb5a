"""Names of a package imported on first use, so that importing the package (and ``af1 --help``, which imports every
command's flags) costs no torch import: ``__getattr__ = exports(__name__, {"SEARCH": "circuits.search.analysis"})``
in the package's ``__init__``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def exports(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: each name of ``names`` from its module (imported then), and the
    package's submodules by their names."""

    def getattr_(name: str) -> object:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return getattr_
