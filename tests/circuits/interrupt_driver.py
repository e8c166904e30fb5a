"""Run ``af1`` with a signal sent to this very process at a chosen point of the run, so that a test interrupts it
at that point every time (no sleeping and hoping)::

    python -m tests.circuits.interrupt_driver PHASE SIGNAL -- ARGV...

``PHASE`` is a key of :data:`POINTS`, ``SIGNAL`` a name such as ``SIGTERM``, ``SIGINT`` or ``SIGKILL``. The process
exits with ``af1``'s exit code (or dies of the signal)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

POINTS: dict[str, tuple[str, str, str | None, int]] = {
    "means": ("interventions.cache", "MeanCache", "fit", 1),  # fitting the means on the fit set
    "sweep": ("circuits.runner", "", "run", 2),  # the second cell of a sweep (the first finished)
    "prune": ("circuits.prune.greedy", "", "summarize", 3),  # after two points of the pruning curve
    "lens": ("circuits.lens.decode", "", "early_decode", 1),  # decoding, before lens.json is written
}
"""phase -> (module, class or "", attribute, which call sends the signal)."""


def arm(phase: str, sig: signal.Signals) -> None:
    """Wrap the phase's function so that its ``n``-th call first sends ``sig`` to this process."""
    module_name, owner_name, attr, nth = POINTS[phase]
    module = importlib.import_module(module_name)
    owner: Any = getattr(module, owner_name) if owner_name else module
    target: Callable[..., Any] = getattr(owner, str(attr))
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), sig)
        return target(*args, **kwargs)

    setattr(owner, str(attr), wrapper)


def main(argv: list[str]) -> int:
    phase, name, sep, *command = argv
    assert sep == "--", "usage: PHASE SIGNAL -- ARGV..."
    from circuits import cli

    sig = signal.Signals[name]
    if sig == signal.SIGINT:  # as from a terminal: a process started in the background (nohup, `&`) inherits
        signal.signal(signal.SIGINT, signal.default_int_handler)  # SIGINT ignored, and Ctrl-C never reaches it
    arm(phase, sig)
    return cli.main(command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
