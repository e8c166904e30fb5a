"""The operand space of a task (a :class:`circuits.tasks.TaskSpec`): its valid operand tuples (answer within
the task's bounds) in a seeded order, and how many there are.

A space of at most :data:`ENUM_LIMIT` tuples (the product of the slots' ranges) is enumerated exhaustively and
shuffled with ``numpy.random.default_rng(seed).permutation``. A larger one (three operands in 0..999: 10^9
tuples, the range Llama-3 writes as single tokens) is never enumerated: its order is a stream of uniform draws
from ``numpy.random.default_rng(seed)``, :data:`CHUNK` tuples at a time (each slot uniform in its range), with
tuples out of bounds, excluded tuples and repeats dropped. Every prefix of the stream is a sample without
replacement, uniform over the valid tuples, and the same whatever length is asked for, so windows
``start .. start + n - 1`` of one seed never repeat a prompt, as in an enumerated space. The size of such a space
is estimated from :data:`ESTIMATE_DRAWS` uniform draws (:class:`SpaceSize` with ``exact`` false).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

from circuits.errors import ArgumentError

__all__ = ["NO_MIN", "NO_MAX", "ENUM_LIMIT", "CHUNK", "ESTIMATE_DRAWS", "MAX_DRY_CHUNKS", "SpaceSize", "operand_ranges",
           "n_tuples", "enumerate_operands", "ordered_operands", "space_size"]

NO_MIN, NO_MAX = -(2 ** 62), 2 ** 62
"""``answer_min`` / ``answer_max`` of a task without bounds (re-exported by :mod:`circuits.tasks`)."""
ENUM_LIMIT = 5_000_000
"""Operand spaces of up to this many tuples (valid or not) are enumerated; larger ones are drawn from."""
CHUNK = 65_536
"""Tuples drawn at a time in a space too large to enumerate (part of the stream's definition: changing it
changes which prompts a seed gives)."""


class SpaceSpec(Protocol):
    """What the operand space reads of a task (a :class:`~circuits.tasks.TaskSpec`): its slots' inclusive ranges,
    the bounds of an integer answer and the answers of an ``[n, n_operands]`` operand array (frozen: hashable)."""

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str | None: ...

    @property
    def operand_ranges(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def answer_min(self) -> int: ...

    @property
    def answer_max(self) -> int: ...

    @property
    def n_operands(self) -> int: ...

    @property
    def numeric(self) -> bool: ...

    def answers(self, operands: np.ndarray) -> np.ndarray: ...

    def __hash__(self) -> int:
        """A spec is hashable: the size of its space is cached by it."""
        ...
ESTIMATE_DRAWS = 1 << 20
"""Uniform draws (seed 0) the size of a space too large to enumerate is estimated from."""
MAX_DRY_CHUNKS = 16
"""A stream stops (the space is exhausted for practical purposes) after this many chunks in a row that add
no new tuple."""


@dataclass(frozen=True)
class SpaceSize:
    """Number of valid operand tuples of a task: ``n``, counted (``exact``) or estimated from
    :data:`ESTIMATE_DRAWS` uniform draws (relative standard error about ``1 / sqrt(accepted draws)``)."""

    n: int
    exact: bool

    def describe(self) -> str:
        """``"3240"``, or ``"about 5.00e+08"`` for an estimate."""
        return str(self.n) if self.exact else f"about {self.n:.3g}"


def operand_ranges(spec: SpaceSpec, ranges: Sequence[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
    """The inclusive ``(lo, hi)`` range of each slot of ``spec``: ``ranges`` when given (one per operand,
    else :class:`~circuits.errors.ArgumentError`), the spec's own otherwise."""
    out = [(int(lo), int(hi)) for lo, hi in (ranges or spec.operand_ranges)]
    if len(out) != spec.n_operands:
        raise ArgumentError(f"task {spec.name!r} has {spec.n_operands} operands, got {len(out)} ranges")
    return out


def n_tuples(ranges: Sequence[tuple[int, int]]) -> int:
    """Number of operand tuples in ``ranges``, valid or not (the product of the ranges' sizes)."""
    return math.prod(max(0, hi - lo + 1) for lo, hi in ranges)


def _valid(spec: SpaceSpec, ops: np.ndarray) -> np.ndarray:
    """Which rows of ``ops`` (``[n, n_operands]``) give an answer within the task's bounds."""
    if not spec.numeric or len(ops) == 0:
        return np.ones(len(ops), dtype=bool)
    ans = spec.answers(ops)
    return (ans >= spec.answer_min) & (ans <= spec.answer_max)


def enumerate_operands(spec: SpaceSpec, ranges: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
    """Every valid operand tuple of ``spec`` as an ``[n, n_operands]`` int64 array in lexicographic order;
    :class:`~circuits.errors.ArgumentError` for a space of more than :data:`ENUM_LIMIT` tuples."""
    rs = operand_ranges(spec, ranges)
    total = n_tuples(rs)
    if total > ENUM_LIMIT:
        where = f"task file {spec.path}: slots: " if spec.path else ""
        raise ArgumentError(f"{where}operand space of {spec.name!r} has {total} tuples, more than {ENUM_LIMIT} to "
                            f"list one by one: draw prompts from it (build_task) instead of enumerating it")
    if total == 0:
        return np.zeros((0, spec.n_operands), dtype=np.int64)
    grids = np.meshgrid(*[np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in rs], indexing="ij")
    ops = np.stack([g.reshape(-1) for g in grids], axis=1)
    return ops[_valid(spec, ops)]


class _Stream:
    """The seeded stream of one space too large to enumerate, grown a whole chunk at a time and kept between
    calls (:data:`STREAMS_KEPT`), so that consecutive windows, as the prompt sampler and the fit set ask for
    them, cost the draws of the longest window instead of the sum of every window's prefix. Whole chunks
    give the same order as stopping inside one: a prefix of the stream does not depend on where it ends."""

    def __init__(self, spec: SpaceSpec, ranges: tuple[tuple[int, int], ...], seed: int, exclude: frozenset | None):
        self.spec, self.ranges, self.exclude = spec, ranges, exclude
        self.rng = np.random.default_rng(seed)
        self.seen: set[tuple[int, ...]] = set()
        self.rows: list[list[int]] = []
        self.dry = 0

    def first(self, need: int) -> np.ndarray:
        """The first ``need`` tuples (fewer when :data:`MAX_DRY_CHUNKS` chunks in a row add nothing)."""
        while len(self.rows) < need and self.dry < MAX_DRY_CHUNKS:
            draws = np.stack([self.rng.integers(lo, hi + 1, size=CHUNK, dtype=np.int64) for lo, hi in self.ranges],
                             axis=1)
            before = len(self.rows)
            for row in draws[_valid(self.spec, draws)].tolist():
                key = tuple(row)
                if key in self.seen or (self.exclude and key in self.exclude):
                    continue
                self.seen.add(key)
                self.rows.append(row)
            self.dry = self.dry + 1 if len(self.rows) == before else 0
        out = self.rows[:need]
        return np.asarray(out, dtype=np.int64).reshape(len(out), len(self.ranges))


STREAMS_KEPT = 4
"""Streams kept between calls (the most recently used), by (task, ranges, seed, exclusions)."""
_streams: dict[tuple, _Stream] = {}


def _stream(spec: SpaceSpec, ranges: list[tuple[int, int]], seed: int, exclude: set | None, need: int) -> np.ndarray:
    """The first ``need`` tuples of the seeded stream of a space too large to enumerate (:class:`_Stream`)."""
    key = (spec, tuple(ranges), seed, frozenset(exclude) if exclude else None)
    stream = _streams.pop(key, None) or _Stream(spec, key[1], seed, key[3])
    _streams[key] = stream  # most recently used last
    while len(_streams) > STREAMS_KEPT:
        del _streams[next(iter(_streams))]
    return stream.first(need)


def ordered_operands(spec: SpaceSpec, n: int, seed: int = 0, ranges: Sequence[tuple[int, int]] | None = None,
                     exclude: set[tuple[int, ...]] | None = None, start: int = 0) -> np.ndarray:
    """Rows ``start .. start + n - 1`` of the seeded order of ``spec``'s valid operand tuples (``exclude``
    left out first), as an ``[m, n_operands]`` int64 array, ``m <= n`` when the space ends first: see the module
    docstring. :class:`~circuits.errors.ArgumentError` when no tuple in the ranges is valid."""
    rs = operand_ranges(spec, ranges)
    if n_tuples(rs) <= ENUM_LIMIT:
        ops = enumerate_operands(spec, rs)
        if exclude:
            ops = ops[np.fromiter((tuple(int(x) for x in row) not in exclude for row in ops), bool, len(ops))]
        empty = len(ops) == 0
        ops = ops[np.random.default_rng(seed).permutation(len(ops))[start:start + n]]
    else:
        ops = _stream(spec, rs, seed, exclude, start + n)
        empty = len(ops) == 0
        ops = ops[start:]
    if empty:
        where = f"task file {spec.path}: answer_min/answer_max: " if spec.path else ""
        raise ArgumentError(f"{where}task {spec.name!r}: operand ranges {[list(r) for r in rs]} yield no prompt "
                            f"with an answer in [{spec.answer_min}, {spec.answer_max}]")
    return ops


def space_size(spec: SpaceSpec, ranges: Sequence[tuple[int, int]] | None = None) -> SpaceSize:
    """How many valid operand tuples ``spec`` has: counted when the space can be enumerated (or every tuple is
    valid), else estimated from :data:`ESTIMATE_DRAWS` uniform draws of seed 0. Kept per (spec, ranges): the
    checks before loading, the prompt sampler and the fit set all ask."""
    return _space_size(spec, tuple(operand_ranges(spec, ranges)))


@lru_cache(maxsize=64)
def _space_size(spec: SpaceSpec, rs: tuple[tuple[int, int], ...]) -> SpaceSize:
    total = n_tuples(rs)
    if total <= ENUM_LIMIT:
        return SpaceSize(len(enumerate_operands(spec, rs)), True)
    rng = np.random.default_rng(0)
    draws = np.stack([rng.integers(lo, hi + 1, size=ESTIMATE_DRAWS, dtype=np.int64) for lo, hi in rs], axis=1)
    accepted = int(_valid(spec, draws).sum())
    if accepted == ESTIMATE_DRAWS and (not spec.numeric or (spec.answer_min, spec.answer_max) == (NO_MIN, NO_MAX)):
        return SpaceSize(total, True)
    return SpaceSize(round(total * accepted / ESTIMATE_DRAWS), False)
