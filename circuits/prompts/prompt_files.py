"""Prompt files (``--prompts`` / ``--fit-prompts``: ``.jsonl`` or ``.csv``) and ``Dataset`` rows, read and checked
into one ``Dataset`` before any model loads.

What a file may be, and the one-line :class:`~circuits.errors.ArgumentError` (naming the file, the line and the
column) for anything else:

* at most :data:`MAX_PROMPTS_FILE` bytes of UTF-8 text (a leading byte-order mark is dropped);
* ``.jsonl``: one JSON object a line; lines end at ``\\n``, ``\\r\\n`` or ``\\r`` only, so U+2028, U+0085 and the other
  Unicode line separators inside a JSON string are text, not line ends; no key twice in one object, no integer
  beyond +-10^18, no ``NaN``, no value nested deeper than :data:`circuits.tasks.inputs.MAX_DEPTH`;
* ``.csv``: a header naming each column once, then one row per record; a quoted field keeps its newlines (the
  file goes to the CSV reader whole, never split into lines first); every row has as many fields as the header;
* every text field at most :data:`MAX_FIELD` characters; columns ``prompt`` (non-empty text) and ``answer``
  (non-empty text or an integer); slot columns hold text, numbers or booleans;
* each prompt once: a repeated prompt would be scored (or fitted on) twice, so it is refused naming both lines.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from circuits.errors import ArgumentError
from circuits.tasks.inputs import MAX_INT, InputError, json_value, read_text, short, shown
from circuits.tasks.package_data import find_file
from interventions.types import JsonDict

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["LINE", "MAX_FIELD", "MAX_PROMPTS_FILE", "NOT_SLOTS", "PROMPT_SUFFIXES", "prompts_label", "read_prompts"]

PROMPT_SUFFIXES = (".jsonl", ".csv")
"""File types ``--prompts`` reads."""
LINE = "_line"
"""The column :func:`read_prompts` adds: where each row came from (``"line 3"`` of a file, ``"row 2"`` of a Dataset)."""
NOT_SLOTS = ("prompt", "answer", "answer_text", "answer_ids", "layout", "operands", "task", LINE)
"""Columns that are not slot values."""
MAX_PROMPTS_FILE = 128 << 20
"""Largest prompts file (bytes): 128 MiB, about a million prompts."""
MAX_FIELD = 131_072
"""Longest text field of a prompts file (characters; the CSV reader's own limit)."""


class Columns(Protocol):
    """Rows as named columns, read as :func:`read_prompts` reads a ``datasets.Dataset`` (any object read the same
    way will do): ``column_names``, ``len()``, a column's values by name and ``to_dict()``."""

    @property
    def column_names(self) -> list[str]: ...

    def __getitem__(self, column: str, /) -> Sequence[object]: ...

    def __len__(self) -> int: ...

    def to_dict(self) -> dict[str, list[object]]:
        """The columns as lists (what :func:`circuits.prompts.prepared.dataset_key` hashes)."""
        ...


PromptData: TypeAlias = "str | Path | Columns"
"""A prompt dataset: a ``.jsonl`` / ``.csv`` path or a ``Dataset`` (:class:`Columns`)."""


def prompts_label(source: PromptData) -> str:
    """How runs name a prompt dataset: the file path, or ``dataset:<fingerprint>`` for a ``Dataset``."""
    if isinstance(source, (str, Path)):
        return str(source)
    return f"dataset:{getattr(source, '_fingerprint', None) or len(source)}"


def read_prompts(source: PromptData) -> Dataset:
    """The rows of ``source`` (a ``.jsonl`` / ``.csv`` path or a ``datasets.Dataset``) as a ``Dataset``, checked
    (see the module docstring): one-line :class:`~circuits.errors.ArgumentError` naming the file, the line and the
    column otherwise."""
    from datasets import Dataset

    if not isinstance(source, (str, Path)):
        columns = getattr(source, "column_names", None)
        if columns is None:
            raise ArgumentError(f"prompts: {type(source).__name__} is neither a .jsonl/.csv path nor a Dataset")
        cols = checked({c: list(source[c]) for c in columns if c != LINE}, "prompts dataset",
                       [f"row {i}" for i in range(len(source))])
        return Dataset.from_dict({**cols, LINE: [f"row {i}" for i in range(len(cols["prompt"]))]})
    path = find_file(source)  # as --task finds a file: here, else the shipped examples (examples/capital.jsonl)
    if path.suffix.lower() not in PROMPT_SUFFIXES:
        raise ArgumentError(f"prompts file {path}: give a .jsonl or .csv file (columns prompt, answer)")
    text = read_text(path, "prompts file", MAX_PROMPTS_FILE)
    where = f"prompts file {path}"
    rows, lines, names = _csv(text, where) if path.suffix.lower() == ".csv" else _jsonl(text, where)
    if not rows:
        raise ArgumentError(f"prompts file {path} has no rows: give one prompt and answer a line")
    for n, row in zip(lines, rows):
        missing = [k for k in names if k not in row]
        if missing:
            raise ArgumentError(f"{where}: line {n}: column {missing[0]}: missing (every row needs the same "
                                f"columns)")
    cols = {k: [r[k] for r in rows] for k in names if k != LINE}
    cols = checked(cols, where, [f"line {n}" for n in lines])
    return Dataset.from_dict({**cols, LINE: [f"line {n}" for n in lines]})


def _csv(text: str, where: str) -> tuple[list[JsonDict], list[int], list[str]]:
    """``(rows, first line of each, column names)`` of a CSV text, read whole by the CSV reader (quoted fields
    keep their newlines; only ``\\n`` and ``\\r`` end a record)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[JsonDict] = []
    lines: list[int] = []
    header: list[str] | None = None
    start = 1
    try:
        for record in reader:
            if not record:  # a blank line
                start = reader.line_num + 1
                continue
            if header is None:
                header = record
                empty = [i for i, name in enumerate(header) if not name.strip()]
                if empty:
                    raise InputError(f"{where}: line {start}: header column {empty[0] + 1} has no name")
                twice = [name for i, name in enumerate(header) if name in header[:i]]
                if twice:
                    raise InputError(f"{where}: line {start}: header names column {twice[0]!r} twice (each column "
                                     f"once: which one is meant?)")
            elif len(record) != len(header):
                raise InputError(f"{where}: line {start}: {len(record)} fields, but the header names "
                                 f"{len(header)} columns (quote a field that holds a comma)")
            else:
                rows.append(dict(zip(header, record)))
                lines.append(start)
            start = reader.line_num + 1
    except csv.Error as err:
        reason = str(err)
        if "field larger than field limit" in reason:
            reason = f"a field is longer than {MAX_FIELD} characters, the most a prompts file may hold"
        elif "NUL" in reason:
            reason = "holds a NUL character (is this a text file?)"
        raise InputError(f"{where}: line {start}: not CSV ({reason})") from None
    return rows, lines, header or []


def _jsonl(text: str, where: str) -> tuple[list[JsonDict], list[int], list[str]]:
    """``(rows, line of each, column names)`` of a JSON-lines text: lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (JSON
    holds neither raw inside a string), so U+2028, U+0085 and other Unicode line separators are text."""
    import re

    rows: list[JsonDict] = []
    lines: list[int] = []
    for n, line in enumerate(re.split(r"\r\n|\r|\n", text), start=1):
        if not line.strip():
            continue
        row = json_value(line, where, line=n)
        if not isinstance(row, dict):
            raise InputError(f"{where}: line {n}: must be a JSON object with prompt and answer")
        rows.append(row)
        lines.append(n)
    return rows, lines, list(dict.fromkeys(k for r in rows for k in r))


def checked(cols: dict[str, list[object]], where: str, lines: list[str]) -> dict[str, list[object]]:
    """``cols`` (columns of rows; ``lines[i]`` names row ``i``, e.g. ``"line 3"``) checked as the module docstring
    says, mixed columns made text; one-line :class:`~circuits.errors.ArgumentError` after ``where``."""
    for key in ("prompt", "answer"):
        if key not in cols:
            raise ArgumentError(f"{where}: column {key}: missing (columns prompt and answer are needed)")
    for i, (p, a) in enumerate(zip(cols["prompt"], cols["answer"])):
        if not isinstance(p, str) or not p:
            raise ArgumentError(f"{where}: {lines[i]}: column prompt: {shown(p)} is not a non-empty string")
        if isinstance(a, bool) or not isinstance(a, (str, int)) or a == "":
            raise ArgumentError(f"{where}: {lines[i]}: column answer: {shown(a)} is not a non-empty string or "
                                f"an integer")
        if isinstance(a, int) and abs(a) > MAX_INT:
            raise ArgumentError(f"{where}: {lines[i]}: column answer: {short(str(a), 40)} is beyond +-10^18")
    if "answer_text" in cols and any(not isinstance(t, str) or not t for t in cols["answer_text"]):
        i = next(i for i, t in enumerate(cols["answer_text"]) if not isinstance(t, str) or not t)
        raise ArgumentError(f"{where}: {lines[i]}: column answer_text: not a non-empty string")
    for key, column in cols.items():
        for i, v in enumerate(column):
            if isinstance(v, str) and len(v) > MAX_FIELD:
                raise ArgumentError(f"{where}: {lines[i]}: column {key}: {len(v)} characters, more than the "
                                    f"{MAX_FIELD} a field may hold")
            if key not in NOT_SLOTS and v is not None and not isinstance(v, (str, int, float, bool)):
                raise ArgumentError(f"{where}: {lines[i]}: column {key}: {short(json.dumps(v))} is not a slot value "
                                    f"(text, a number or a boolean)")
    first: dict[object, int] = {}
    for i, p in enumerate(cols["prompt"]):
        if p in first:
            raise ArgumentError(f"{where}: {lines[i]}: column prompt: {short(str(p))} repeats {lines[first[p]]} "
                                f"(give each prompt once: a repeated prompt would count twice)")
        first[p] = i
    for key, column in cols.items():  # one type a column: mixed integers and text become text
        if len({type(v) for v in column}) > 1:
            cols[key] = [v if isinstance(v, str) else json.dumps(v) for v in column]
    return cols
