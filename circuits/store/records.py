"""Schemas of the JSONL result records, checked before a resumed run uses them.

A record read back from a run directory feeds the selection, the heatmaps and the summaries directly,
so every field is checked for its type and the run's ranges first (a ``wait`` of ``-5`` would land in
another heatmap cell through a negative index; a record computed on 3 prompts would be selected as if
it were computed on 200). Anything off is one :class:`~circuits.errors.CorruptRunError` naming the
file, the line and the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuits.errors import CorruptRunError
from circuits.store.outcomes import record_problem
from interventions.types import JsonDict

FIX = "the file was not written by this command: move it away or use a new --out directory"


@dataclass(frozen=True)
class Field:
    """One field of a record.

    ``kind``: ``"int"``, ``"float"`` (an int is accepted), ``"str"``, ``"list"`` or ``"any"``.
    ``lo``/``hi``: inclusive numeric bounds; ``choices``: allowed values; ``required=False``: may be
    missing; ``nullable``: may be ``null`` (non-finite floats are stored as ``null``).
    """

    name: str
    kind: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] | None = None
    required: bool = True
    nullable: bool = False

    def problem(self, record: JsonDict) -> str | None:
        """What is wrong with this field of ``record`` (``None`` if nothing)."""
        if self.name not in record:
            return None if not self.required else "is missing"
        value = record[self.name]
        if value is None:
            return None if self.nullable else "is null"
        if self.kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            return f"must be an integer, found {value!r}"
        if self.kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                     or not math.isfinite(value)):
            return f"must be a finite number, found {value!r}"
        if self.kind == "str" and not isinstance(value, str):
            return f"must be a string, found {value!r}"
        if self.kind == "list" and not isinstance(value, list):
            return f"must be a list, found {value!r}"
        if self.lo is not None and value < self.lo or self.hi is not None and value > self.hi:
            return f"= {value!r} is outside {_fmt(self.lo)}..{_fmt(self.hi)}"
        if self.choices is not None and value not in self.choices:
            return f"= {value!r} is not one of {', '.join(map(repr, self.choices))}"
        return None


def _fmt(x: float | None) -> str:
    return "" if x is None else (str(int(x)) if float(x).is_integer() else f"{x:g}")


@dataclass(frozen=True)
class RecordSchema:
    """The fields of one results file, a cross-field check and the key that must be unique.

    ``check(record)`` returns a ``(field, problem)`` pair for a record whose fields are fine one by one
    but not together (e.g. ``transfer > n_layers-1-wait``), else ``None``.
    """

    fields: tuple[Field, ...]
    key: tuple[str, ...] = ()
    check: Callable[[JsonDict], tuple[str, str] | None] | None = None

    def validate(self, path: str | Path, numbered: Iterable[tuple[int, JsonDict]]) -> list[JsonDict]:
        """The records of ``numbered`` (``(line, record)`` pairs) if every one is valid, else raise
        :class:`~circuits.errors.CorruptRunError` for the first bad field or repeated key."""
        seen: dict[tuple, int] = {}
        out = []
        for line, record in numbered:
            for f in self.fields:
                problem = f.problem(record)
                if problem is not None:
                    raise CorruptRunError(f"{path}, line {line}: field {f.name!r} {problem}; {FIX}")
            bad = consistency_problem(record)
            if bad is not None:
                raise CorruptRunError(f"{path}, line {line}: field {bad[0]!r} {bad[1]}; {FIX}")
            if self.check is not None:
                bad = self.check(record)
                if bad is not None:
                    raise CorruptRunError(f"{path}, line {line}: field {bad[0]!r} {bad[1]}; {FIX}")
            if self.key:
                k = tuple(_hashable(record.get(name)) for name in self.key)
                if k in seen:
                    raise CorruptRunError(
                        f"{path}, line {line}: {', '.join(f'{n}={v!r}' for n, v in zip(self.key, k))} repeats "
                        f"line {seen[k]}; {FIX}"
                    )
                seen[k] = line
            out.append(record)
        return out


def consistency_problem(record: JsonDict) -> tuple[str, str] | None:
    """A ``(field, problem)`` pair for a faithfulness record whose numbers do not agree (``None`` if they do,
    or if the record has no faithfulness): ``faithfulness`` must be ``n_faithful / n``, its bootstrap
    interval must hold it, and neither end may lie further from it than a bootstrap of ``n`` prompts can
    (five standard errors ``sqrt(f (1 - f) / n)`` plus ``1/n``; an interval of a faithfulness of 0 or 1 is
    that point); the per-prompt outcomes a search stores must agree with these totals
    (:func:`circuits.store.outcomes.record_problem`). The fields were type-checked before."""
    f, n = record.get("faithfulness"), record.get("n")
    if not isinstance(f, (int, float)) or not isinstance(n, int) or n < 1:
        return None
    k = record.get("n_faithful")
    if isinstance(k, int) and abs(f - k / n) > 1e-9:
        return "faithfulness", f"= {f!r} is not n_faithful / n = {k}/{n} = {k / n:.6g}"
    lo, hi = record.get("ci_low"), record.get("ci_high")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        if not lo - 1e-9 <= f <= hi + 1e-9:
            return "faithfulness", f"= {f!r} lies outside its interval [ci_low, ci_high] = [{lo!r}, {hi!r}]"
        reach = 5 * math.sqrt(max(f * (1 - f), 0.0) / n) + 1 / n
        for name, end in (("ci_low", lo), ("ci_high", hi)):
            if abs(end - f) > reach + 1e-9:
                return name, (f"= {end!r} is further from faithfulness {f!r} than a bootstrap of {n} prompts "
                              f"reaches ({reach:.3g})")
    return record_problem(record)


def _hashable(value: Any) -> Any:
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


def faithfulness_fields(n_prompts: int) -> tuple[Field, ...]:
    """The fields every faithfulness record shares (:class:`circuits.faithfulness.FaithfulnessResult`):
    fractions in [0, 1], ``n`` equal to the run's prompt count."""
    return (
        Field("faithfulness", "float", 0.0, 1.0),
        Field("ci_low", "float", 0.0, 1.0, required=False, nullable=True),
        Field("ci_high", "float", 0.0, 1.0, required=False, nullable=True),
        Field("n", "int", n_prompts, n_prompts),
        Field("n_faithful", "int", 0, n_prompts, required=False),
        Field("mean_answer_prob", "float", 0.0, 1.0, required=False, nullable=True),
        Field("mean_logit_diff", "float", required=False, nullable=True),
    )


def layer_field(name: str, n_layers: int, *, lo: int = 0) -> Field:
    """A 0-indexed block field in ``lo .. n_layers-1``."""
    return Field(name, "int", lo, n_layers - 1)
