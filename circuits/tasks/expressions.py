"""Answer expressions of task files: ``+ - *``, parentheses, slot names and integer constants, parsed with :mod:`ast`
and evaluated by walking the tree (nothing is ``eval``-ed), exactly: on int64 arrays when no sub-expression can
pass 64 bits for the values at hand, on Python integers otherwise, so an answer never wraps around.

Limits, each a one-line :class:`~circuits.errors.ArgumentError` that gives the reason before the (shortened)
expression: at most :data:`MAX_EXPRESSION` characters, nested at most :data:`MAX_EXPRESSION_DEPTH` deep,
constants within +-10^18 (:data:`circuits.tasks.inputs.MAX_INT`).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np

from circuits.errors import ArgumentError
from circuits.tasks.inputs import MAX_INT, short

__all__ = ["MAX_EXPRESSION", "MAX_EXPRESSION_DEPTH", "evaluate", "expression_range", "expression_slots"]

MAX_EXPRESSION = 1000
"""Longest answer expression (characters)."""
MAX_EXPRESSION_DEPTH = 64
"""Deepest answer expression: operators and parentheses nested inside each other."""
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _parse(text: str) -> ast.expr:
    """The tree of ``text``, checked for size first: at most :data:`MAX_EXPRESSION` characters, nested at most
    :data:`MAX_EXPRESSION_DEPTH` deep (one-line :class:`~circuits.errors.ArgumentError`, the reason before the
    echoed expression)."""
    text = text.strip()
    if len(text) > MAX_EXPRESSION:
        raise ArgumentError(f"the expression is {len(text)} characters long, more than {MAX_EXPRESSION}: write a "
                            f"shorter one ({short(text)})")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as err:
        raise ArgumentError(f"not an expression ({err.msg}): {short(text)}") from None
    except (RecursionError, MemoryError):
        raise ArgumentError(f"the expression nests more than {MAX_EXPRESSION_DEPTH} levels deep: write a flatter "
                            f"one ({short(text)})") from None
    depth = _depth(node)
    if depth > MAX_EXPRESSION_DEPTH:
        raise ArgumentError(f"the expression nests {depth} levels deep, more than {MAX_EXPRESSION_DEPTH}: write a "
                            f"flatter one ({short(text)})")
    return node


def _depth(node: ast.AST) -> int:
    """How deep ``node``'s tree is, without recursion."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in ast.iter_child_nodes(n))
    return deepest


def _check(node: ast.expr, names: set[str]) -> None:
    """:class:`~circuits.errors.ArgumentError` naming the first construct outside ``+ - *``, parentheses, slot
    names and integers (within +-10^18)."""
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ArgumentError(f"operator {short(ast.unparse(node))} is not allowed: use + - * and parentheses")
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check(node.operand, names)
    elif isinstance(node, ast.Name):
        names.add(node.id)
    elif isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        if abs(node.value) > MAX_INT:
            raise ArgumentError(f"the constant {short(str(node.value), 40)} is beyond +-10^18, the largest integer "
                                f"a task may use")
    else:
        raise ArgumentError(f"{short(ast.unparse(node))} is not allowed: use slot names, integers, + - * and "
                            f"parentheses")


def expression_slots(text: str) -> list[str]:
    """The slot names ``text`` uses (each once); :class:`~circuits.errors.ArgumentError` for anything but
    ``+ - *``, parentheses, names and integer constants within +-10^18, or an expression longer than
    :data:`MAX_EXPRESSION` characters or deeper than :data:`MAX_EXPRESSION_DEPTH`."""
    node = _parse(text)
    _check(node, set())
    return list(dict.fromkeys(n.id for n in ast.walk(node) if isinstance(n, ast.Name)))


def _interval(node: ast.expr, extents: Mapping[str, tuple[int, int]]) -> tuple[int, int, int]:
    """``(lo, hi, largest)``: exact bounds of ``node``'s value when each name ``n`` lies in ``extents[n]``
    (Python integers, interval arithmetic), and the largest magnitude any sub-expression can reach."""
    if isinstance(node, ast.BinOp):
        a, b, m1 = _interval(node.left, extents)
        c, d, m2 = _interval(node.right, extents)
        if isinstance(node.op, ast.Add):
            lo, hi = a + c, b + d
        elif isinstance(node.op, ast.Sub):
            lo, hi = a - d, b - c
        else:
            corners = (a * c, a * d, b * c, b * d)
            lo, hi = min(corners), max(corners)
        return lo, hi, max(m1, m2, abs(lo), abs(hi))
    if isinstance(node, ast.UnaryOp):
        lo, hi, m = _interval(node.operand, extents)
        return (-hi, -lo, m) if isinstance(node.op, ast.USub) else (lo, hi, m)
    if isinstance(node, ast.Name):
        lo, hi = extents[node.id]
        return lo, hi, max(abs(lo), abs(hi))
    value = cast(int, cast(ast.Constant, node).value)
    return value, value, abs(value)


def expression_range(text: str, extents: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """Exact bounds ``(lo, hi)`` (Python integers) of the expression ``text`` when each slot ``n`` lies in the
    inclusive ``extents[n]``: every value it takes lies within them (interval arithmetic may be wider)."""
    lo, hi, _ = _interval(_parse(text), extents)
    return lo, hi


INT64 = 2 ** 63 - 1
"""Largest int64: a sub-expression that may pass it is evaluated on Python integers."""


def evaluate(text: str, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """The expression ``text`` evaluated element-wise, exactly (``columns``: slot name -> ``[n]`` integers): int64
    when no sub-expression can pass 64 bits for these values, else Python integers (an object array), so that an
    answer never wraps around."""
    node = _parse(text)
    cols = {k: np.asarray(v, dtype=np.int64) for k, v in columns.items()}
    n = len(next(iter(cols.values()))) if cols else 0
    extents = {k: (int(v.min()), int(v.max())) if len(v) else (0, 0) for k, v in cols.items()}
    exact = _interval(node, extents)[2] > INT64
    kind: Any = object if exact else np.int64
    if exact:
        cols = {k: v.astype(object) for k, v in cols.items()}

    def walk(node: ast.expr) -> Any:
        if isinstance(node, ast.BinOp):
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Name):
            return cols[node.id]
        constant = cast(int, cast(ast.Constant, node).value)  # an integer constant (checked by expression_slots)
        return constant if exact else np.int64(constant)

    out = np.empty(n, dtype=kind)
    out[:] = walk(node)
    return out
