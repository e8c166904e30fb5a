"""Command-line flags declared once, on the fields of the dataclasses they set.

A field that a command line may set carries :func:`flag` metadata: its help text and, where its default does not say
it, its type, choices or flag name. :func:`add_flags` adds the flags of a dataclass's fields to a parser (help and
default from the field, ``(default X)`` appended); :func:`values` reads them back from the parsed arguments as the
dataclass's keyword arguments. So ``--n-prompts`` is declared once, on :attr:`PromptSpec.n_prompts
<circuits.prompts.spec.PromptSpec.n_prompts>`, and every command that takes it adds it from there (a command may
give it another default).

Conventions: the flag of field ``fit_size`` is ``--fit-size`` unless ``name`` says otherwise; a ``bool`` field with
default ``False`` is a switch (``--remote``); one with default ``True`` and a ``--no-...`` name is a switch that
turns it off (``--no-progress``); ``tristate=True`` makes ``--x/--no-x`` with ``None`` when neither is given.
Nothing here imports torch: the command modules build their parsers from these when ``af1 --help`` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interventions.types import JsonDict, JsonMapping


__all__ = ["KEY", "Flag", "add_flags", "flag", "flag_fields", "values"]

KEY = "flag"
"""The metadata key of a field's :class:`Flag`."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a field appears on the command line (see :func:`flag`)."""

    help: str
    name: str | None = None
    type: Callable[[str], object] | None = None
    choices: Sequence[str] | None = None
    tristate: bool = False
    metavar: str | None = None


def flag(help: str, *, name: str | None = None, type: Callable[[str], object] | None = None,
         choices: Sequence[str] | None = None, tristate: bool = False, metavar: str | None = None) -> dict[str, Flag]:
    """The ``metadata`` of a dataclass field that a command line sets: ``field(default=0.9, metadata=flag("..."))``.

    ``help``: what the value means, with its unit or range (the default is appended); ``name``: the flag
    (default ``--`` and the field's name with ``-`` for ``_``); ``type``: how the text becomes a value (default: the
    type of the field's default, ``str`` for ``None``); ``choices``: the valid values; ``tristate``: a ``bool | None``
    field given as ``--x``/``--no-x``."""
    return {KEY: Flag(help=help, name=name, type=type, choices=choices, tristate=tristate, metavar=metavar)}


def flag_fields(cls: type) -> dict[str, tuple[dataclasses.Field[object], Flag]]:
    """The fields of dataclass ``cls`` that carry a :class:`Flag`, by field name, in declaration order."""
    return {f.name: (f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata}


def flag_name(field: dataclasses.Field[object], spec: Flag, prefix: str = "") -> str:
    return spec.name or "--" + prefix + field.name.replace("_", "-")


def dest_of(name: str) -> str:
    """The attribute the parsed arguments keep a flag's value in (``--fit-size`` -> ``fit_size``)."""
    return name.lstrip("-").replace("-", "_")


def default_of(field: dataclasses.Field[object]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def add_flags(parser: argparse.ArgumentParser, cls: type, names: Iterable[str] | None = None, *, prefix: str = "",
              defaults: JsonMapping | None = None, required: Iterable[str] = (),
              helps: Mapping[str, str] | None = None) -> None:
    """Add the flags of ``cls``'s fields ``names`` (default: every field with a :class:`Flag`) to ``parser``.

    ``prefix``: put before each derived flag name (``--fit-`` for the fit set's fields); ``defaults``: other defaults
    by field name (shown in the help); ``required``: fields the command line must give; ``helps``: another help text
    by field name, for a command whose use of the field differs."""
    fields = flag_fields(cls)
    defaults, helps, required = dict(defaults or {}), dict(helps or {}), set(required)
    for name in (names if names is not None else fields):
        field, spec = fields[name]
        option = flag_name(field, spec, prefix)
        own = default_of(field)
        default = defaults.get(name, own)
        text = helps.get(name, spec.help)
        kwargs: dict[str, Any] = {"dest": dest_of(option)}
        if isinstance(own, bool) and not spec.tristate:
            kwargs.update(action="store_true", default=False)
        elif spec.tristate:
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        else:
            kwargs.update(type=spec.type or (type(own) if own is not None else str), default=default)
            if spec.choices is not None:
                kwargs["choices"] = tuple(spec.choices)
            if spec.metavar is not None:
                kwargs["metavar"] = spec.metavar
        if name in required:
            kwargs.update(required=True)
            kwargs.pop("default", None)
        elif default is not None and not isinstance(default, bool):
            text += f" (default {default})"
        parser.add_argument(option, help=text, **kwargs)


def values(cls: type, args: argparse.Namespace, names: Iterable[str] | None = None, *,
           prefix: str = "") -> JsonDict:
    """The keyword arguments of ``cls`` that the flags of ``names`` (default: every field with a :class:`Flag`) hold
    in the parsed ``args`` (a ``--no-x`` switch of a field that defaults to ``True`` turns it off)."""
    fields = flag_fields(cls)
    out: JsonDict = {}
    for name in (names if names is not None else fields):
        field, spec = fields[name]
        value = getattr(args, dest_of(flag_name(field, spec, prefix)))
        inverted = default_of(field) is True and flag_name(field, spec, prefix).startswith("--no-")
        out[name] = (not value) if inverted else value
    return out
