"""Task files: a task of one's own as a TOML (or JSON) file, read and checked into a :class:`~circuits.tasks.TaskSpec`.

A task file defines a template with named slots, the values of each slot, the answer and how it is
written (see ``docs/tasks.md`` for the full reference)::

    name = "mul"
    template = "{A}*{B}="
    answer = "A*B"                  # + - * and parentheses over integer slots (integer constants allowed)
    answer_min = 0                  # optional bounds on integer answers (prompts outside are never drawn)
    answer_max = 520

    [slots]
    A = { range = [0, 99] }         # an inclusive integer range ...
    B = { range = [0, 99] }

    # ... or a list of strings, and a lookup column as the answer:
    # template = "The capital of {country} is"
    # answer_format = " {}"         # the answer as written after the prompt: here with a leading space
    # [slots]
    # country = { values = ["France", "Japan"] }
    # [answer]
    # lookup = "country"
    # table = { France = "Paris", Japan = "Tokyo" }

Optional keys: ``prefix`` (text before every prompt, e.g. solved examples), ``answer_format`` (``"{}"``),
``default_n`` (1000), ``group`` / ``style`` (``"custom"``), ``card`` (a description), ``frozen`` (a JSON-lines
frozen set, relative to the file), ``frozen_seed`` / ``frozen_n`` (how :func:`circuits.tasks.write_frozen_sets`
draws it). Every problem is one :class:`~circuits.errors.ArgumentError` line naming the file and the field.

The expression is parsed with :mod:`ast` and evaluated on integer arrays by walking the tree; nothing is
``eval``-ed. The shipped catalogue (``datasets/tasks/``) is written in this format:
``catalogue.toml`` lists the task names in order (and the frozen-set seed and size), one ``<name>.toml``
per task.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from circuits.errors import ArgumentError
from circuits.tasks.expressions import (
    MAX_EXPRESSION,
    MAX_EXPRESSION_DEPTH,
    evaluate,
    expression_range,
    expression_slots,
)
from circuits.tasks.inputs import MAX_INT, InputError, json_value, read_text, short
from circuits.tasks.operand_space import NO_MAX, NO_MIN
from interventions.types import JsonDict, JsonMapping

__all__ = ["CATALOGUE", "FROZEN_N", "FROZEN_SEED", "MAX_EXPRESSION", "MAX_EXPRESSION_DEPTH", "MAX_FROZEN_FILE",
           "MAX_TASK_FILE", "TaskFileError", "catalogue_fields", "evaluate", "expression_range", "expression_slots",
           "legacy_catalogue", "read_frozen", "read_mapping", "spec_fields", "toml_module"]

CATALOGUE = "catalogue.toml"
"""The index of a catalogue folder (``tasks/``): ``tasks = [...]`` in order, ``frozen_seed``, ``frozen_n``."""
FROZEN_SEED = 20_250_901
"""Default seed of a task's frozen set (the catalogue's)."""
FROZEN_N = 300
"""Default size of a task's frozen set (the catalogue's)."""

KEYS = ("name", "template", "slots", "answer", "answer_min", "answer_max", "answer_format", "prefix", "default_n",
        "group", "style", "card", "frozen", "frozen_seed", "frozen_n")
"""The keys a task file may hold."""
MAX_TASK_FILE = 1 << 20
"""Largest task file (bytes): 1 MiB holds a lookup table of tens of thousands of values."""
MAX_FROZEN_FILE = 128 << 20
"""Largest frozen set (bytes), as a prompts file."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")


class TaskFileError(InputError):
    """A task file is unreadable or invalid; the message names the file and the field."""


def read_mapping(path: str | Path) -> JsonDict:
    """The top-level table of a ``.toml`` or ``.json`` file (one-line :class:`TaskFileError` otherwise)."""
    path = Path(path)
    try:
        text = read_text(path, "task file", MAX_TASK_FILE)  # UTF-8, a byte-order mark dropped
    except InputError as err:
        raise TaskFileError(str(err)) from None
    if path.suffix.lower() == ".json":
        try:  # duplicate keys, integers beyond 10^18 and deep nesting refused, naming the line
            raw = json_value(text, f"task file {path}")
        except InputError as err:
            raise TaskFileError(str(err)) from None
    else:
        toml = toml_module()
        try:
            raw = toml.loads(text)  # refuses a key given twice
        except toml.TOMLDecodeError as err:
            raise TaskFileError(f"task file {path} is not valid TOML: {' '.join(str(err).split())}") from None
        except ValueError:  # an integer of thousands of digits
            raise TaskFileError(f"task file {path}: an integer has more digits than Python reads; integers of a "
                                f"task lie within +-10^18") from None
        except RecursionError:
            raise TaskFileError(f"task file {path}: a value is nested too deeply to read") from None
    if not isinstance(raw, dict):
        raise TaskFileError(f"task file {path} must hold one table (a JSON object), not {type(raw).__name__}")
    return raw


def read_frozen(path: str | Path, n_operands: int) -> list[JsonDict]:
    """The rows of a frozen set (JSON lines with ``prompt``, ``answer``, ``operands`` and ``task``), read as a prompts
    file is (UTF-8, lines end at ``\\n`` only, no key twice, integers within +-10^18): one-line
    :class:`TaskFileError` naming the file, the line and the field otherwise."""
    where = f"frozen set {path}"
    try:
        text = read_text(path, "frozen set", MAX_FROZEN_FILE)
    except InputError as err:
        raise TaskFileError(str(err)) from None
    rows = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json_value(line, where, line=n)
        except InputError as err:
            raise TaskFileError(str(err)) from None
        if not isinstance(row, dict) or any(k not in row for k in ("prompt", "answer", "operands", "task")):
            raise TaskFileError(f"{where}: line {n}: must be a JSON object with prompt, answer, operands and task")
        ops = row["operands"]
        if (not isinstance(ops, list) or len(ops) != n_operands
                or any(isinstance(x, bool) or not isinstance(x, int) for x in ops)):
            raise TaskFileError(f"{where}: line {n}: operands: must be a list of {n_operands} integers")
        if not isinstance(row["prompt"], str) or isinstance(row["answer"], bool) \
                or not isinstance(row["answer"], (str, int)):
            raise TaskFileError(f"{where}: line {n}: prompt must be text and answer text or an integer")
        rows.append(row)
    return rows


def toml_module() -> ModuleType:
    """The TOML reader: :mod:`tomllib` (Python 3.11+), else the ``tomli`` backport (a dependency on 3.10)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the tomli backport (a dependency there)
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib


# ------------------------------------------------------------------------------------------ validation
def spec_fields(raw: JsonMapping, where: str, *, base: Path | None = None) -> JsonDict:
    """The :class:`~circuits.tasks.TaskSpec` fields of a task file's table ``raw``; ``where`` names the file in
    errors and ``base`` is the folder relative paths (``frozen``) start from. One-line :class:`TaskFileError`
    naming ``where`` and the field on the first problem."""
    def fail(field: str, message: str) -> TaskFileError:
        return TaskFileError(f"task file {where}: {field}: {message}")

    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise fail(unknown[0], f"unknown key; a task file holds {', '.join(KEYS)}")
    for key in ("name", "template", "slots", "answer"):
        if key not in raw:
            raise fail(key, "missing (a task file needs name, template, slots and answer)")
    name = raw["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail("name", f"{name!r} must be a word (letters, digits, _ . -), e.g. \"mul\"")
    template = raw["template"]
    if not isinstance(template, str) or not template:
        raise fail("template", "must be a non-empty string with {slot} placeholders")
    try:
        used = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
        bad = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None and (spec or conv)]
    except ValueError as err:
        raise fail("template", f"{err} (write a literal brace as {{{{ or }}}})") from None
    if bad or any(not f.isidentifier() for f in used):
        raise fail("template", "placeholders must be plain slot names such as {A} or {country}")
    if not used:
        raise fail("template", "has no {slot} placeholder")
    names, values, ranges = _slots(raw["slots"], fail)
    missing = [u for u in used if u not in names]
    if missing:
        raise fail("template", f"unknown slot {{{missing[0]}}}; the slots are {', '.join(names)}")
    unused = [n for n in names if n not in used]
    if unused:
        raise fail(f"slots.{unused[0]}", "is not used in the template")
    answer = _answer(raw["answer"], names, values, fail)
    fields: JsonDict = {"name": name, "template": template, "operand_names": tuple(names),
                              "operand_ranges": tuple(ranges),
                              "slot_values": tuple(values) if any(v is not None for v in values) else (), **answer}
    lookup = "lookup" in answer
    for key, default in (("answer_min", None), ("answer_max", None), ("default_n", 1000)):
        value = raw.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise fail(key, f"{value!r} must be an integer")
        if value is not None and lookup and key != "default_n":
            raise fail(key, "applies to integer answers only, not to a lookup column")
        if value is not None and abs(value) > MAX_INT:
            raise fail(key, f"{short(str(value), 40)} is beyond +-10^18, the largest integer a task may use")
        fields[key] = value
    if fields["default_n"] < 1:
        raise fail("default_n", f"{fields['default_n']} must be >= 1")
    lo = fields["answer_min"] if fields["answer_min"] is not None else NO_MIN
    hi = fields["answer_max"] if fields["answer_max"] is not None else NO_MAX
    if lo > hi:
        raise fail("answer_min", f"{lo} is above answer_max {hi}")
    if not lookup:  # answers are exact; without bounds they must stay within +-10^18
        reach = expression_range(fields["expression"], dict(zip(names, ranges)))
        for key, value, beyond in (("answer_min", reach[0], reach[0] < -MAX_INT),
                                   ("answer_max", reach[1], reach[1] > MAX_INT)):
            if beyond and fields[key] is None:
                raise fail("answer", f"can reach {short(str(value), 40)}, beyond +-10^18 (64-bit integers): set "
                                     f"{key} within +-10^18 or narrow the slot ranges")
    fields["answer_min"], fields["answer_max"] = lo, hi
    for key, text_default in (("prefix", ""), ("answer_format", "{}"), ("group", "custom"), ("style", "custom"),
                              ("card", "")):
        text = raw.get(key, text_default)
        if not isinstance(text, str):
            raise fail(key, f"{text!r} must be a string")
        fields[key] = text
    fmt = fields["answer_format"]
    if fmt.count("{}") != 1 or fmt.replace("{}", "").count("{") or fmt.replace("{}", "").count("}"):
        raise fail("answer_format", f"{fmt!r} must hold the answer once as {{}}, e.g. \" {{}}\" for a leading space")
    fields["frozen_file"] = None
    if "frozen" in raw:
        if not isinstance(raw["frozen"], str) or not raw["frozen"]:
            raise fail("frozen", f"{raw['frozen']!r} must be a path (relative to the task file)")
        fields["frozen_file"] = str((base or Path(".")) / raw["frozen"])
    for key, default, least in (("frozen_seed", FROZEN_SEED, 0), ("frozen_n", FROZEN_N, 1)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_INT:
            raise fail(key, f"{short(repr(value), 30)} must be an integer in {least}..10^18")
        fields[key] = value
    return fields


def _slots(raw: object, fail: Callable[[str, str], TaskFileError]
           ) -> tuple[list[str], list[tuple[str, ...] | None], list[tuple[int, int]]]:
    """``(names, values, ranges)``: per slot its string values (``None`` for an integer range) and its range
    (the index range ``(0, len - 1)`` for string values)."""
    if not isinstance(raw, dict) or not raw:
        raise fail("slots", "must be a table of slots, e.g. [slots] A = { range = [0, 99] }")
    names: list[str] = []
    values: list[tuple[str, ...] | None] = []
    ranges: list[tuple[int, int]] = []
    for name, slot in raw.items():
        field = f"slots.{name}"
        if not name.isidentifier():
            raise fail(field, "a slot name must be a word (letters, digits, _)")
        if not isinstance(slot, dict) or len(set(slot) & {"range", "values"}) != 1 or set(slot) - {"range", "values"}:
            raise fail(field, "give either range = [lo, hi] (integers) or values = [\"...\", ...] (strings)")
        if "range" in slot:
            r = slot["range"]
            if (not isinstance(r, list) or len(r) != 2
                    or any(isinstance(x, bool) or not isinstance(x, int) for x in r)):
                raise fail(f"{field}.range", f"{r!r} must be [lo, hi], two integers")
            if any(abs(x) > MAX_INT for x in r):
                raise fail(f"{field}.range", f"{short(str(r), 40)} reaches beyond +-10^18, the largest integer a task "
                                             f"may use: narrow the range")
            if r[0] > r[1]:
                raise fail(f"{field}.range", f"{r!r} is empty: lo {r[0]} is above hi {r[1]}")
            values.append(None)
            ranges.append((int(r[0]), int(r[1])))
        else:
            v = slot["values"]
            if not isinstance(v, list) or not v:
                raise fail(f"{field}.values", "is empty: give at least one string")
            if any(not isinstance(x, str) or not x for x in v):
                bad = next(x for x in v if not isinstance(x, str) or not x)
                raise fail(f"{field}.values", f"{bad!r} is not a non-empty string")
            if len(set(v)) != len(v):
                raise fail(f"{field}.values", f"{next(x for x in v if v.count(x) > 1)!r} is listed twice")
            values.append(tuple(v))
            ranges.append((0, len(v) - 1))
        names.append(name)
    return names, values, ranges


def _answer(raw: object, names: list[str], values: list[Any], fail: Callable[[str, str], TaskFileError]) -> JsonDict:
    """``{"expression": ...}`` or ``{"expression": "", "lookup": (slot, table)}``."""
    if isinstance(raw, str):
        try:
            used = expression_slots(raw)
        except ArgumentError as err:
            raise fail("answer", str(err)) from None
        for n in used:
            if n not in names:
                raise fail("answer", f"unknown slot {n!r}; the slots are {', '.join(names)}")
            if values[names.index(n)] is not None:
                raise fail("answer", f"slot {n!r} holds strings: an expression needs integer slots (use a lookup)")
        return {"expression": raw.strip()}
    if not isinstance(raw, dict) or set(raw) != {"lookup", "table"}:
        raise fail("answer", "give an expression such as \"A*B\", or a table with lookup = \"slot\" and table = {...}")
    slot, table = raw["lookup"], raw["table"]
    if slot not in names:
        raise fail("answer.lookup", f"unknown slot {slot!r}; the slots are {', '.join(names)}")
    if not isinstance(table, dict) or not table:
        raise fail("answer.table", "must map every value of the slot to its answer string")
    bad = [k for k, v in table.items() if not isinstance(v, str) or not v]
    if bad:
        raise fail(f"answer.table.{bad[0]}", f"{table[bad[0]]!r} is not a non-empty string (answers are strings)")
    keys = values[names.index(slot)]
    if keys is None:
        raise fail("answer.lookup", f"slot {slot!r} is an integer range: a lookup needs a slot of string values")
    extra = [k for k in table if k not in keys]
    if extra:
        raise fail(f"answer.table.{extra[0]}", f"is not a value of slot {slot!r}")
    missing = [k for k in keys if k not in table]
    if missing:
        raise fail("answer.table", f"no answer for {slot} = {missing[0]!r}")
    return {"expression": "", "lookup": (slot, tuple((k, table[k]) for k in keys))}



# ------------------------------------------------------------------------------------------ catalogues
def catalogue_fields(folder: str | Path) -> dict[str, JsonDict]:
    """The task fields of a catalogue folder, by name in catalogue order: ``catalogue.toml`` (``tasks = [...]``,
    ``frozen_seed``, ``frozen_n``) and one ``<name>.toml`` per name; frozen sets in ``../frozen/<name>.jsonl``."""
    folder = Path(folder)
    index = read_mapping(folder / CATALOGUE)
    names = index.get("tasks")
    if not isinstance(names, list) or not names or any(not isinstance(n, str) for n in names):
        raise ArgumentError(f"task catalogue {folder / CATALOGUE}: tasks: must list the task names, "
                            f"e.g. tasks = [\"add\"]")
    out = {}
    for name in names:
        path = folder / f"{name}.toml"
        raw = read_mapping(path)
        raw.setdefault("frozen_seed", index.get("frozen_seed", FROZEN_SEED))
        raw.setdefault("frozen_n", index.get("frozen_n", FROZEN_N))
        fields = spec_fields(raw, str(path), base=folder)
        if fields["name"] != name:
            raise TaskFileError(f"task file {path}: name: {fields['name']!r} differs from its catalogue entry {name!r}")
        fields["frozen_file"] = str(folder.parent / "frozen" / f"{name}.jsonl")
        out[name] = fields
    return out


def legacy_catalogue(path: str | Path) -> dict[str, JsonDict]:
    """The task fields of a catalogue in the earlier one-file format (``tasks.json``: ``{"tasks": [...]}`` with
    ``name``, ``template``, ``expression``, ``operand_names``, ``operand_ranges``, ``answer_min``, ``answer_max``,
    ``default_n``, ``group``, ``style``, ``card``); one-line :class:`~circuits.errors.ArgumentError` if malformed."""
    try:
        raw = json.loads(Path(path).read_text())
        frozen = Path(path).parent / "frozen"
        return {t["name"]: dict(
            name=t["name"], template=t["template"], expression=t["expression"], operand_names=tuple(t["operand_names"]),
            operand_ranges=tuple((int(lo), int(hi)) for lo, hi in t["operand_ranges"]),
            answer_min=int(t["answer_min"]), answer_max=int(t["answer_max"]), default_n=int(t["default_n"]),
            group=t["group"], style=t["style"], card=t["card"], frozen_file=str(frozen / f"{t['name']}.jsonl"),
            frozen_seed=int(raw.get("frozen_seed", FROZEN_SEED)), frozen_n=int(raw.get("frozen_n", FROZEN_N)),
        ) for t in raw["tasks"]}
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as err:
        what = f"missing field {err}" if isinstance(err, KeyError) else " ".join(str(err).split())[:160]
        raise ArgumentError(f"task catalogue {path} is malformed ({what}): it needs {{\"tasks\": [...]}} with the "
                            f"fields name, template, expression, operand_names, operand_ranges, answer_min, "
                            f"answer_max, default_n, group, style, card; fix it or unset AF1_DATASETS_DIR") from None
