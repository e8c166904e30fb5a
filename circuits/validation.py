"""The analyses' checks of scalar arguments, one set for the command line, the configs and the API: the checks
of :mod:`interventions.validation` raising :class:`~circuits.errors.ArgumentError`. A ``name`` spelled as a flag
(``"--threshold"``) reads ``--threshold 2.0 is out of range: ...``, a field (``"threshold"``)
``threshold=2.0 is out of range: ...``. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence

from circuits.errors import ArgumentError
from interventions import validation as _v

__all__ = ["THREADS_PER_CORE", "check_choice", "check_config", "check_fraction", "check_int", "check_positive",
           "check_threads", "max_threads"]

THREADS_PER_CORE = 4
"""Most torch CPU threads a command may ask for, per core of this machine (:func:`max_threads`): more only
oversubscribes the cores, and tens of thousands exhaust the process's memory and crash it."""


def check_int(name: str, value: object, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` if it is an integer in ``minimum .. maximum`` (booleans refused), else :class:`ArgumentError`."""
    return _v.check_int(name, value, minimum, maximum, error=ArgumentError)


def check_positive(name: str, value: object, maximum: int | None = None) -> int:
    """``value`` if it is an integer ``>= 1`` (and ``<= maximum``), else :class:`ArgumentError`."""
    return _v.check_int(name, value, 1, maximum, error=ArgumentError)


def check_fraction(name: str, value: object) -> float:
    """``value`` as a float in [0, 1] (a faithfulness fraction; NaN refused), else :class:`ArgumentError`."""
    return _v.check_fraction(name, value, error=ArgumentError)


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices`` (a tuple of :mod:`circuits.vocab`), else :class:`ArgumentError`."""
    return _v.check_choice(name, value, choices, error=ArgumentError)


def check_config(n_layers: int, wait: object, transfer: object, *, min_transfer: int = 0) -> None:
    """:class:`ArgumentError` unless ``(wait, transfer)`` is an AF1 configuration of a model of ``n_layers``
    blocks (:func:`circuits.vocab.config_problem`, the one range rule; ``min_transfer=1`` for pruning)."""
    from circuits.vocab import config_problem

    problem = config_problem(n_layers, wait, transfer, min_transfer=min_transfer)
    if problem is not None:
        raise ArgumentError(problem)


def max_threads() -> int:
    """The largest ``--threads`` accepted here: :data:`THREADS_PER_CORE` per CPU core (``os.cpu_count()``)."""
    import os

    return THREADS_PER_CORE * (os.cpu_count() or 1)


def check_threads(name: str, value: object) -> int:
    """``value`` if it is an integer in ``1 .. max_threads()``, else :class:`ArgumentError` saying the bound and
    the machine's cores (``name`` is the flag or variable, e.g. ``"--threads"``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} {value} is out of range: give an integer >= 1")
    threads = value
    limit = max_threads()
    if threads > limit:
        import os

        raise ArgumentError(f"{name} {threads} is out of range: this machine has {os.cpu_count() or 1} CPU cores; "
                            f"give at most {limit} ({THREADS_PER_CORE} per core), e.g. --threads 1 on a busy "
                            f"machine")
    return threads
