"""The types of a sweep config's values, checked before anything is built or written.

TOML (and the flags) give strings, integers, floats, booleans, lists and tables; a value of the wrong
kind (``n_prompts = "20"``, ``n_prompts = true``, ``seeds = [1.5]``), a repeated list entry
(``ablations = ["zero", "zero"]``) or an unknown ``dtype`` is one :class:`~circuits.errors.ArgumentError`
naming the key, before a model is loaded or a ``run.json`` written.
"""

from __future__ import annotations

from typing import Any

from circuits.errors import ArgumentError
from circuits.vocab import DTYPES
from interventions.types import JsonMapping

INTS = ("n_prompts", "batch_size", "fit_size", "fit_min_count", "fit_seed", "shots", "wait", "transfer")
FLOATS = ("threshold",)
STRS = ("mode", "grid", "source", "device", "backend", "dtype", "device_map", "fit_population", "numbers")
BOOLS = ("necessity", "lens", "remote", "chat")
STR_LISTS = ("models", "tasks", "ablations", "analyses")
INT_LISTS = ("seeds",)
NULLABLE = ("wait", "transfer", "backend", "dtype", "device_map", "max_memory")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_types(raw: JsonMapping) -> None:
    """:class:`ArgumentError` naming the first key of ``raw`` (a ``[sweep]`` table) whose value has the wrong
    type, a list with a repeated entry, or an unknown ``dtype``. Unknown keys are left to the caller."""
    for key, value in raw.items():
        if value is None and key in NULLABLE:
            continue
        if key in INTS and not _is_int(value):
            raise ArgumentError(f"sweep key {key} = {value!r} must be an integer")
        if key in FLOATS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ArgumentError(f"sweep key {key} = {value!r} must be a number")
        if key in STRS and not isinstance(value, str):
            raise ArgumentError(f"sweep key {key} = {value!r} must be a string")
        if key in BOOLS and not isinstance(value, bool):
            raise ArgumentError(f"sweep key {key} = {value!r} must be true or false")
        if key == "max_memory" and not isinstance(value, (str, dict)):
            raise ArgumentError(f"sweep key max_memory = {value!r} must be a string or a table")
        if key in STR_LISTS or key in INT_LISTS:
            items = [value] if isinstance(value, (str, int)) and not isinstance(value, bool) else value
            if not isinstance(items, (list, tuple)) or not items:
                raise ArgumentError(f"sweep key {key} = {value!r} must be a non-empty list")
            ok = _is_int if key in INT_LISTS else (lambda v: isinstance(v, str) and v.strip() != "")
            bad = [v for v in items if not ok(v)]
            if bad:
                kind = "integers" if key in INT_LISTS else "non-empty strings"
                raise ArgumentError(f"sweep key {key} must hold {kind}, found {bad[0]!r}")
            repeated = sorted({v for v in items if list(items).count(v) > 1}, key=str)
            if repeated:
                raise ArgumentError(f"sweep key {key} repeats {', '.join(map(repr, repeated))}: give each once")
    for key in ("seeds", "fit_seed"):
        values = raw.get(key)
        values = values if isinstance(values, (list, tuple)) else [values]
        if any(_is_int(v) and v < 0 for v in values):
            raise ArgumentError(f"sweep key {key} = {raw[key]!r}: seeds are integers >= 0")
    if isinstance(raw.get("dtype"), str) and raw["dtype"] not in DTYPES:
        raise ArgumentError(f"sweep key dtype = {raw['dtype']!r} is not valid: choose one of {', '.join(DTYPES)}")
