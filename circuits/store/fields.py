"""Typed fields of a run directory's JSON files (``run.json``, ``summary.json``) read back by a reopened or
resumed run: a missing field, a value of the wrong type or out of range is one
:class:`~circuits.errors.CorruptRunError` line naming the file and the field (an older or edited directory is
never a bare ``KeyError`` or ``ValueError``). Torch-free."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from circuits.errors import CorruptRunError

if TYPE_CHECKING:
    from interventions.types import JsonMapping  # torch is imported only where a model is

__all__ = ["FIX", "MISSING", "choice", "corrupt", "fraction", "integer", "mapping", "number", "text"]

FIX = "the directory was edited or written by an incompatible release: rerun into a new --out directory"
"""How to go on, said by every error of this module."""


class _Missing:
    """The default of a field that must be present."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()
"""``default=MISSING``: the field is required."""

D = TypeVar("D")
"""The type of a field's default (``None``, or a value of the field's own type)."""


def corrupt(path: str | Path, name: str, problem: str) -> CorruptRunError:
    """The error of field ``name`` of ``path``: ``<path>: field 'name' <problem>; <FIX>``."""
    return CorruptRunError(f"{path}: field {name!r} {problem}; {FIX}")


def _default(name: str, path: str | Path, default: D | _Missing) -> D:
    """The value of field ``name`` absent (or null) from its document: ``default``; a required one is an error."""
    if isinstance(default, _Missing):
        raise corrupt(path, name, "is missing")
    return default


T = TypeVar("T")


def _of_type(doc: JsonMapping, name: str, path: str | Path, kind: type[T], what: str, default: D | _Missing) -> T | D:
    """Field ``name`` as an instance of ``kind`` (``what`` names it in the error), or ``default`` when absent."""
    if doc.get(name) is None:
        return _default(name, path, default)
    value = doc[name]
    if not isinstance(value, kind):
        raise corrupt(path, name, f"= {_shown(value)} is not {what}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number(doc: JsonMapping, name: str, path: str | Path, default: D | _Missing = MISSING, *,
           finite: bool = False) -> float | D:
    """Field ``name`` of ``doc`` (read from ``path``) as a float: a JSON number (booleans and strings refused;
    NaN allowed unless ``finite``), else ``default`` when absent or null."""
    if doc.get(name) is None:
        return _default(name, path, default)
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise corrupt(path, name, f"= {_shown(value)} is not a number")
    try:
        out = float(value)
    except OverflowError:
        raise corrupt(path, name, "is a number too large for a float") from None
    if finite and not math.isfinite(out):
        raise corrupt(path, name, f"= {out} is not a finite number")
    return out


def fraction(doc: JsonMapping, name: str, path: str | Path, default: D | _Missing = MISSING) -> float | D:
    """Field ``name`` as a fraction in [0, 1] (a threshold, an accuracy; NaN allowed: not measured)."""
    if doc.get(name) is None:
        return _default(name, path, default)
    value = number(doc, name, path)
    if not math.isnan(value) and not 0.0 <= value <= 1.0:
        raise corrupt(path, name, f"= {value:g} is not a fraction in [0, 1]")
    return value


def integer(doc: JsonMapping, name: str, path: str | Path, default: D | _Missing = MISSING, *,
            minimum: int | None = 0) -> int | D:
    """Field ``name`` as an integer ``>= minimum`` (booleans, floats and strings refused)."""
    if doc.get(name) is None:
        return _default(name, path, default)
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise corrupt(path, name, f"= {_shown(value)} is not an integer")
    if minimum is not None and value < minimum:
        raise corrupt(path, name, f"= {value} is below {minimum}")
    return value


def text(doc: JsonMapping, name: str, path: str | Path, default: D | _Missing = MISSING) -> str | D:
    """Field ``name`` as a string."""
    return _of_type(doc, name, path, str, "a string", default)


def choice(doc: JsonMapping, name: str, path: str | Path, choices: tuple[str, ...],
           default: D | _Missing = MISSING) -> str | D:
    """Field ``name`` as one of ``choices`` (a tuple of :mod:`circuits.vocab`)."""
    value = text(doc, name, path, default)
    if value is not default and value not in choices:
        raise corrupt(path, name, f"= {_shown(value)} is not one of {', '.join(choices)}")
    return value


def mapping(doc: JsonMapping, name: str, path: str | Path, default: D | _Missing = MISSING) -> JsonMapping | D:
    """Field ``name`` as a JSON object."""
    return _of_type(doc, name, path, Mapping, "an object", default)  # type: ignore[type-abstract]  # isinstance takes it
