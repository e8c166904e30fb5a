"""Where a command's time went: load, prompts, fit (or cached), analysis, report, measured once by the runner.

The runner (:func:`circuits.runner.run`) times its steps into the :class:`Timings` of the command running it
(:func:`command`, which :mod:`circuits.cli` opens around every command and which prints :meth:`Timings.line` as the
command's last line); a run outside a command (the Python API) gets its own and logs the line when it ends. A
command of several runs (a sweep) adds them up. Seconds are wall-clock (``time.perf_counter``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["PHASES", "Timings", "command", "current", "note_means", "phase"]

PHASES = ("load", "prompts", "fit", "analysis", "report")
"""The steps of a run, in order: loading the model; preparing the prompts (checking which the model answers, drawing
the fit set, checking coverage); fitting the means (or reading them from a cache); the analysis; writing its summary
and report."""


@dataclass
class Timings:
    """Seconds per phase (:data:`PHASES`) of the runs of one command, how many runs fitted their means and how many
    reused them (from the run directory or the user's cache), when the command started and what the total is called
    (``whole``: ``"whole command"``, ``"whole run"`` for a run of the Python API)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    runs: int = 0
    fitted: int = 0
    cached: int = 0
    started: float = field(default_factory=time.perf_counter)
    whole: str = "whole command"

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the ``with`` body to phase ``name`` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def line(self) -> str:
        """One line: ``time: load 1.2 s, prompts 0.8 s, fit cached 0.1 s, analysis 4.3 s, report 0.2 s; whole
        command 7.1 s`` (``fit 49.0 s`` when fitted; with several runs, how many fitted and how many were
        cached; ``other``: the time outside the runs' phases, imports and printing; the whole command is counted from
        when :func:`command` was given its start, the Python interpreter's own start not included)."""
        s = self.seconds
        parts = [f"load {s['load']:.1f} s", f"prompts {s['prompts']:.1f} s"]
        if self.fitted and self.cached:
            parts.append(f"fit {s['fit']:.1f} s ({self.fitted} fitted, {self.cached} cached)")
        elif self.cached:
            parts.append(f"fit cached {s['fit']:.1f} s")
        elif self.fitted:
            parts.append(f"fit {s['fit']:.1f} s")
        else:
            parts.append("fit none")
        parts += [f"analysis {s['analysis']:.1f} s", f"report {s['report']:.1f} s"]
        total = time.perf_counter() - self.started
        other = total - sum(s.values())
        runs = f" ({self.runs} runs)" if self.runs > 1 else ""
        return (f"time{runs}: {', '.join(parts)}, other {max(other, 0.0):.1f} s (imports, printing); {self.whole} "
                f"{total:.1f} s")


_CURRENT: ContextVar[Timings | None] = ContextVar("af1_timings", default=None)


def current() -> Timings | None:
    """The :class:`Timings` of the command running now (``None`` outside :func:`command`)."""
    return _CURRENT.get()


@contextlib.contextmanager
def command(started: float | None = None) -> Iterator[Timings]:
    """Collect the timings of every run inside the ``with`` body into one :class:`Timings`; ``started``: when the
    command started (``time.perf_counter()``; default now)."""
    timings = Timings() if started is None else Timings(started=started)
    token = _CURRENT.set(timings)
    try:
        yield timings
    finally:
        _CURRENT.reset(token)


def note_means(fitted: bool) -> None:
    """Count the means of a run as fitted (``True``) or reused (from its directory, the user's cache or the
    caller), in the :class:`Timings` of the command running now (if any)."""
    timings = current()
    if timings is not None:
        if fitted:
            timings.fitted += 1
        else:
            timings.cached += 1


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the ``with`` body into phase ``name`` of the command running now (nothing outside a command): for a
    command that loads or prepares before handing to the runner (``af1 demo``)."""
    timings = current()
    if timings is None:
        yield
        return
    with timings.phase(name):
        yield
