"""``af1 groundtruth``: does the AF1 search and head pruning recover the structure planted in the
ground-truth zoo models? (See :mod:`circuits.groundtruth` and ``docs/groundtruth.md``.)

For every planted model (or ``--models``), task and ablation: the search (full grid) and exact greedy
head pruning at the selected configuration; writes ``table.csv``, ``table.md``, ``summary.json``,
``figures/*.svg``, ``report.html`` and the run directories (``runs/<model>/<task>/<ablation>/``) to
``--out``. Re-running the same command resumes from the run directories.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=None,
                        help="comma-separated planted zoo models (default: every model with a planted ground truth)")
    parser.add_argument("--tasks", default="add_sub", help="comma-separated tasks (default add_sub)")
    parser.add_argument("--ablations", default="cama,mean,zero",
                        help="comma-separated ablations after the wait block (default cama,mean,zero)")
    parser.add_argument("--n-prompts", type=int, default=200, help="correctly answered prompts per task (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts (default 0)")
    parser.add_argument("--threshold", type=float, default=0.9, help="search: faithfulness needed (default 0.9)")
    parser.add_argument("--target", type=float, default=0.9, help="pruning: faithfulness to keep (default 0.9)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--out", default="runs/groundtruth", help="output directory (default runs/groundtruth)")


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def check(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded."""
    from circuits.commands.common import check_out
    from circuits.errors import ArgumentError
    from circuits.tasks.catalogue import list_tasks
    from circuits.validation import check_fraction, check_positive
    from circuits.vocab import ABLATIONS

    check_fraction("--threshold", args.threshold)
    check_fraction("--target", args.target)
    check_positive("--n-prompts", args.n_prompts)
    bad = [a for a in _split(args.ablations) if a not in ABLATIONS]
    if bad or not _split(args.ablations):
        raise ArgumentError(f"--ablations {args.ablations!r}: choose from {', '.join(ABLATIONS)}")
    unknown = [t for t in _split(args.tasks) if t not in list_tasks()]
    if unknown or not _split(args.tasks):
        raise ArgumentError(f"--tasks {args.tasks!r}: unknown task(s) {unknown}; see circuits.tasks.list_tasks()")
    check_out(args.out)


def run(args: argparse.Namespace) -> int:
    from circuits import report
    from circuits.commands.common import command_line
    from circuits.groundtruth.recovery import run_recovery
    from circuits.groundtruth.report import write_outputs
    from circuits.runner import Run

    with Run(args.out, "groundtruth") as held:  # locked, and refused if another command's, before any model loads
        if report.plotlyjs_mode() == "directory":
            report.ensure_plotlyjs(args.out)  # one plotly.js for the table's report and every run's
        rows = run_recovery(models=_split(args.models) if args.models else None, tasks=_split(args.tasks),
                            n_prompts=args.n_prompts, ablations=_split(args.ablations), out_dir=args.out,
                            seed=args.seed, threshold=args.threshold, target=args.target,
                            progress=not args.no_progress, log=print, held=held)
        paths = write_outputs(rows, args.out, meta={"command": command_line(args), "n_prompts": args.n_prompts,
                                                    "threshold": args.threshold, "target": args.target})
    print()
    print(paths["md"].read_text())
    print(f"{sum(r.config_recovered for r in rows)}/{len(rows)} configurations and "
          f"{sum(r.heads_recovered for r in rows)}/{len(rows)} head sets recovered exactly; "
          f"table: {paths['md']}, report: {paths['html']}")
    return 0
