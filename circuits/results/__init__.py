"""Reopen any af1 output directory without a model: :func:`load` picks the result class from what the
directory holds (``run.json`` names the command).

>>> from circuits import results
>>> r = results.load("runs/s1")           # a SearchResult
>>> r.plot()                              # the report's heatmap, inline in a notebook
>>> r.to_pandas()                         # one row per configuration

Every result class has ``load(run_dir)``, ``to_pandas()`` (pandas is imported only then) and ``plot()`` /
``figures()`` returning the plotly figures its report shows.

>>> c = results.compare(["runs/gpt2", "runs/llama", "runs/sweep"])   # several runs side by side
>>> c.to_pandas()                                                    # one table
>>> c.plot()                                                         # one figure

:func:`compare` reads search, fixed, sweep and necessity runs (:mod:`circuits.results.comparison`) and refuses, in one
line, runs that measure different things or are on different tasks.

Lives here: reopening (this module) and comparing (:mod:`circuits.results.comparison`) finished runs. May import every
analysis's result class, the sweep and the store; nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from circuits.results.comparison import Comparison

__all__ = ["CLASSES", "compare", "load"]

CLASSES = {
    "search": "circuits.search.results:SearchResult",
    "necessity": "circuits.necessity:NecessityResult",
    "prune": "circuits.prune.result:PruneResult",
    "lens": "circuits.lens.result:LensResult",
    "edges": "circuits.edges.result:EdgesResult",
    "sweep": "circuits.sweep.run:SweepResult",
    "groundtruth": "circuits.groundtruth.report:GroundTruthResult",
}
"""The result class of each command's directory (``fixed``, one configuration of a sweep, opens as a search)."""


def kind_of(run_dir: str | Path) -> str:
    """Which command wrote ``run_dir``: ``run.json``'s analysis, else ``groundtruth`` for a recovery table."""
    from circuits.runner import command_of
    from circuits.store import files
    from circuits.store.runs import read_json_object

    path = Path(run_dir)
    if (path / files.IDENTITY).is_file():
        kind = command_of(read_json_object(path / files.IDENTITY))
        return "search" if kind == "fixed" else kind
    if (path / files.SUMMARY).is_file() and (path / files.TABLE_MD).is_file():
        return "groundtruth"
    if (path / files.LENS).is_file():
        return "lens"
    raise FileNotFoundError(f"{path} is not an af1 output directory (no {files.IDENTITY})")


def load(run_dir: str | Path) -> Any:
    """The result stored in ``run_dir``, as the class of the command that wrote it (:data:`CLASSES`)."""
    import importlib

    module, name = CLASSES[kind_of(run_dir)].split(":")
    return getattr(importlib.import_module(module), name).load(run_dir)


def compare(run_dirs: Sequence[str | Path]) -> Comparison:
    """Several runs side by side (:class:`circuits.results.comparison.Comparison`: ``to_pandas()``,
    ``plot()``), each named by its directory as given. :class:`~circuits.errors.ArgumentError` (one line) for a
    directory that is not a run, fewer than two runs, or runs that do not compare (different measures or tasks,
    :mod:`circuits.results.comparison`)."""
    from circuits.errors import ArgumentError
    from circuits.results.comparison import compare_runs, rows_of
    from circuits.store import files
    from circuits.store.runs import read_json_object

    runs = []
    for run_dir in run_dirs:
        path = Path(run_dir)
        if not path.is_dir():
            raise ArgumentError(f"{run_dir}: no such run directory")
        try:
            kind = kind_of(path)
        except FileNotFoundError as err:
            raise ArgumentError(str(err)) from None
        identity = read_json_object(path / files.IDENTITY) if (path / files.IDENTITY).is_file() else {}
        runs.append(rows_of(str(run_dir), kind, identity, load(path)))
    return compare_runs(runs)
