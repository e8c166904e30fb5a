"""The AF1 configurations ``(wait, transfer)`` and the selection rule (see :mod:`circuits.search`).

``wait`` is the index of the last waiting block (0-indexed; ``-1`` = no ablation) and ranges over
``-1 .. n_layers-1``; ``transfer`` counts the blocks ``wait+1 .. wait+transfer`` and ranges over
``0 .. n_layers-1-wait``. Selection: among configurations with faithfulness ``>= threshold`` the
largest ``wait``, ties broken by the smallest ``transfer``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from circuits.validation import check_choice
from circuits.vocab import GRIDS

__all__ = ["NOT_EVALUATED", "Config", "Scored", "configurations", "scan", "select",
           "smallest_transfers"]

NOT_EVALUATED = "not evaluated"

Config = tuple[int, int]


class Scored(Protocol):
    """What :func:`scan` needs of a configuration's result (:class:`circuits.search.results.ConfigResult` is
    one): its faithfulness, a fraction in [0, 1]."""

    @property
    def faithfulness(self) -> float: ...


R = TypeVar("R", bound=Scored)


def configurations(n_layers: int) -> list[Config]:
    """Every ``(wait, transfer)`` of a model with ``n_layers`` blocks, waits from the largest down."""
    return [(w, t) for w in range(n_layers - 1, -2, -1) for t in range(n_layers - w)]


def select(faith: Mapping[Config, float], threshold: float) -> Config | None:
    """The selection rule over evaluated configurations: among those with faithfulness ``>=
    threshold`` the largest ``wait``, then the smallest ``transfer``; ``None`` if none."""
    ok = [c for c, f in faith.items() if f >= threshold]
    if not ok:
        return None
    return max(ok, key=lambda c: (c[0], -c[1]))


def smallest_transfers(
    faith: Mapping[Config, float], n_layers: int, threshold: float
) -> dict[int, int | None | str]:
    """Per wait: the smallest sufficient transfer, ``None`` if every transfer of that wait was evaluated
    and none is sufficient, or ``"not evaluated"`` when the evaluated configurations cannot tell."""
    out: dict[int, int | None | str] = {}
    for w in range(n_layers - 1, -2, -1):
        value: int | None | str = None
        for t in range(n_layers - w):
            if (w, t) not in faith:
                value = NOT_EVALUATED
                break
            if faith[(w, t)] >= threshold:
                value = t
                break
        out[w] = value
    return out


def scan(
    n_layers: int,
    threshold: float,
    grid: str,
    evaluate: Callable[[int, int], R],
    *,
    bar: Any = None,
) -> dict[Config, R]:
    """Evaluate the configurations the grid needs, waits from the largest down and transfers from 0 up.

    ``grid="full"``: every configuration. ``grid="auto"``: a wait stops at its first sufficient
    transfer (``faithfulness >= threshold``) and no lower wait is evaluated after a wait that has one;
    this is exactly what the selection rule needs (see the module docstring). ``evaluate(wait,
    transfer)`` is called in that order, transfers increasing within a wait.
    """
    check_choice("grid", grid, GRIDS)
    results: dict[Config, R] = {}
    for w in range(n_layers - 1, -2, -1):
        found = None
        for t in range(n_layers - w):
            r = evaluate(w, t)
            results[(w, t)] = r
            if bar is not None:
                bar.update(1)
                bar.set_postfix(wait=w, transfer=t, faith=f"{r.faithfulness:.3f}")
            if r.faithfulness >= threshold:
                found = t
                if grid == "auto":
                    break
        if grid == "auto" and found is not None:
            break
    return results
