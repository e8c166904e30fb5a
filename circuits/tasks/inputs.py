"""A user's input files read the one checked way (task files, prompt files): bounded size, UTF-8 text (a leading
byte-order mark accepted), JSON without duplicate keys, without integers beyond :data:`MAX_INT` and without
values nested deeper than :data:`MAX_DEPTH`. Every problem is one :class:`~circuits.errors.ArgumentError` line that
names the file (and the line where there is one) and says how to fix it, before any model loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from circuits.errors import ArgumentError

__all__ = ["MAX_DEPTH", "MAX_INT", "InputError", "check_int_range", "decode", "json_value", "line_of", "nesting",
           "read_text", "short", "shown"]

MAX_INT = 10 ** 18
"""Largest magnitude of an integer in a task file or prompt file (slot values, constants, answers, bounds):
within 64 bits (``2**63`` is about ``9.2e18``) with room for the sums of the checks."""
MAX_DEPTH = 32
"""Deepest nesting of a JSON value (objects and lists inside each other) in an input file."""
ECHO = 60
"""Characters of an input value echoed in a message (after the reason, never before it)."""


class InputError(ArgumentError):
    """An input file is unreadable or invalid; the message names the file, the line or field, and the fix."""


def short(text: str, limit: int = ECHO) -> str:
    """``repr(text)`` cut to about ``limit`` characters (``...`` and the full length when cut)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def shown(value: object, limit: int = ECHO) -> str:
    """``repr(value)``, cut to about ``limit`` characters (a string as :func:`short` shows it)."""
    if isinstance(value, str):
        return short(value, limit)
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def read_text(path: str | Path, what: str, limit: int) -> str:
    """The text of the file ``path`` (``what``: ``"task file"``, ``"prompts file"``), at most ``limit`` bytes,
    decoded as UTF-8 (:func:`decode`); one-line :class:`InputError` otherwise. Reads at most ``limit + 1`` bytes,
    so a device or a file that grows is never read whole."""
    path = Path(path)
    try:
        if path.is_dir():
            raise InputError(f"{what} {path} is a directory: give the path of a file")
        if path.exists() and not path.is_file():
            raise InputError(f"{what} {path} is not a regular file (a pipe or a device): give the path of a file")
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    if len(data) > limit:
        raise InputError(f"{what} {path} is larger than {limit:,} bytes, the most a {what} may hold: split it "
                         f"into smaller files")
    return decode(data, f"{what} {path}")


def decode(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, a leading byte-order mark dropped; :class:`InputError` naming the line and the byte
    of the first invalid sequence."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise InputError(f"{where}: line {line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save the file "
                         f"as UTF-8") from None


def line_of(text: str, offset: int) -> int:
    """The 1-based line of character ``offset`` of ``text`` (lines end at ``\\n`` only)."""
    return text.count("\n", 0, max(0, offset)) + 1


class _Refused(Exception):
    """Raised from inside the JSON parser's hooks; turned into an :class:`InputError` with the file's name."""

    def __init__(self, message: str, key: str | None = None, needle: str | None = None):
        super().__init__(message)
        self.key, self.needle = key, needle


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Refused(f"key {key!r} is given twice (each key once: which one is meant?)", key)
        seen.add(key)
    return dict(pairs)


def _int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > 19 or abs(int(text)) > MAX_INT:
        raise _Refused(f"the integer {short(text, 40)} is beyond +-10^18, the largest an input file may hold",
                       needle=text)
    return int(text)


def _constant(text: str) -> float:
    raise _Refused(f"{text} is not a JSON number (write a finite number or a string)", needle=text)


def json_value(text: str, where: str, line: int | None = None) -> Any:
    """``text`` parsed as one JSON value, refusing duplicate keys, integers beyond :data:`MAX_INT`, ``NaN`` /
    ``Infinity`` and nesting deeper than :data:`MAX_DEPTH`: one-line :class:`InputError` naming ``where`` and the
    line (``line`` for a one-line value, else the line of the problem where it can be found)."""
    def at(n: int | None) -> str:
        return f"{where}: line {n}" if n is not None else where

    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_int=_int, parse_constant=_constant)
    except json.JSONDecodeError as err:
        raise InputError(f"{at(line or err.lineno)}: not JSON ({err.msg}, column {err.colno})") from None
    except _Refused as err:
        n = line
        if n is None and err.key is not None:  # the line of the key's second occurrence, where it can be found
            quoted = json.dumps(err.key)
            first = text.find(quoted)
            second = text.find(quoted, first + 1) if first >= 0 else -1
            n = line_of(text, second) if second >= 0 else None
        elif n is None and err.needle is not None:  # the line of the first such number
            at_ = text.find(err.needle)
            n = line_of(text, at_) if at_ >= 0 else None
        raise InputError(f"{at(n)}: {err}") from None
    except RecursionError:
        raise InputError(f"{at(line)}: a value is nested deeper than {MAX_DEPTH} levels") from None
    depth = nesting(value)
    if depth > MAX_DEPTH:
        raise InputError(f"{at(line)}: a value is nested deeper than {MAX_DEPTH} levels")
    return value


def nesting(value: object) -> int:
    """How deep lists and dicts nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
            deepest = max(deepest, d + 1)
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
            deepest = max(deepest, d + 1)
        if deepest > MAX_DEPTH:
            break
    return deepest


def check_int_range(value: int, what: str) -> int:
    """``value`` when it lies within +-:data:`MAX_INT`, else :class:`InputError` naming ``what``."""
    if abs(value) > MAX_INT:
        raise InputError(f"{what}: {short(str(value), 40)} is beyond +-10^18, the largest integer a task may use")
    return value
