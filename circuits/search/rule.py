"""The AF1 configurations ``(wait, transfer)`` and the selection rule (see :mod:`circuits.search`).

``wait`` is the index of the last waiting block (0-indexed; ``-1`` = no ablation) and ranges over
``-1 .. n_layers-1``; ``transfer`` counts the blocks ``wait+1 .. wait+transfer`` and ranges over
``0 .. n_layers-1-wait``. Selection: among configurations with faithfulness ``>= threshold`` the
largest ``wait``, ties broken by the smallest ``transfer``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, TYPE_CHECKING

from interventions.validation import check_choice

if TYPE_CHECKING:  # pragma: no cover
    from circuits.search.results import ConfigResult

ABLATIONS = ("cama", "mean", "zero")
GRIDS = ("auto", "full")
METHODS = ("fast", "naive")
NOT_EVALUATED = "not evaluated"

Config = tuple[int, int]


def check_config(n_layers: int, wait: int, transfer: int) -> None:
    """Raise ``ValueError`` unless ``-1 <= wait <= n_layers-1`` and ``0 <= transfer <= n_layers-1-wait``."""
    if not isinstance(wait, int) or not -1 <= wait <= n_layers - 1:
        raise ValueError(f"wait={wait!r} is out of range: valid -1..{n_layers - 1} (-1 = no ablation)")
    if not isinstance(transfer, int) or not 0 <= transfer <= n_layers - 1 - wait:
        raise ValueError(f"transfer={transfer!r} is out of range for wait={wait}: valid 0..{n_layers - 1 - wait}")


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
    evaluate: "Callable[[int, int], ConfigResult]",
    *,
    bar: Any = None,
) -> "dict[Config, ConfigResult]":
    """Evaluate the configurations the grid needs, waits from the largest down and transfers from 0 up.

    ``grid="full"``: every configuration. ``grid="auto"``: a wait stops at its first sufficient
    transfer (``faithfulness >= threshold``) and no lower wait is evaluated after a wait that has one;
    this is exactly what the selection rule needs (see the module docstring). ``evaluate(wait,
    transfer)`` is called in that order, transfers increasing within a wait.
    """
    check_choice("grid", grid, GRIDS)
    results: dict[Config, ConfigResult] = {}
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
