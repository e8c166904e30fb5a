"""``af1 compare RUN_DIR RUN_DIR ...``: several runs' results side by side, whichever command wrote them.

Prints one table (:meth:`circuits.results.comparison.Comparison.text`); with ``--out DIR`` also writes ``compare.csv``
(the table of :meth:`~circuits.results.comparison.Comparison.to_pandas`) and ``report.html`` (the figure) there. Runs
that do not compare (different measures or tasks, :mod:`circuits.results.comparison`) are refused in one line before
anything is written."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from circuits.errors import ArgumentError
from circuits.store import files


@dataclass(frozen=True)
class CompareSpecs:
    """What ``af1 compare``'s command line names (:func:`spec`): the run directories in order and ``--out``."""

    runs: tuple[str, ...]
    out: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories of af1 search, necessity or sweep (two or more, compared in this order)")
    parser.add_argument("--out", default=None,
                        help="also write compare.csv and report.html (the figure) to this directory")


def spec(args: argparse.Namespace) -> CompareSpecs:
    return CompareSpecs(runs=tuple(args.runs), out=args.out)


def check(spec: CompareSpecs) -> None:
    """The runs exist and compare (read from their files, no model), and ``--out`` is a folder of its own: not one
    of the runs, nor any af1 run, sweep or table directory (its files would mix with theirs), nor one holding a
    ``report.html`` of something else; an earlier comparison there is replaced."""
    from circuits import results
    from circuits.commands.common import check_out

    results.compare(spec.runs)
    if spec.out is None:
        return
    check_out(spec.out)
    out = Path(spec.out)
    taken = [name for name in (files.IDENTITY, files.SUMMARY, files.TABLE_CSV) if (out / name).exists()]
    if taken:
        raise ArgumentError(f"--out {spec.out} holds {taken[0]}: it is an af1 output directory; give a folder of its "
                            f"own for the comparison")
    if (out / files.REPORT).exists() and not (out / files.COMPARE_CSV).exists():  # a page of something else
        raise ArgumentError(f"--out {spec.out} holds a {files.REPORT} that no comparison wrote; give a folder of its "
                            f"own for the comparison")


def run(spec: CompareSpecs) -> int:
    from circuits import report, results

    comparison = results.compare(spec.runs)
    print(comparison.text())
    if spec.out is not None:
        out = Path(spec.out)
        out.mkdir(parents=True, exist_ok=True)
        report.write_text(out / files.COMPARE_CSV, comparison.to_pandas().to_csv(index=False))
        notes = [f"{len(spec.runs)} runs: {', '.join(spec.runs)}; {files.COMPARE_CSV} holds the table."]
        report.write_page(out / files.REPORT, "af1 compare", comparison.figures(), notes=notes)
        print(f"table: {out / files.COMPARE_CSV}, report: {out / files.REPORT}")
    return 0
