"""``af1 groundtruth``: does the AF1 search and head pruning recover the structure planted in the
ground-truth zoo models? (See :mod:`circuits.groundtruth` and ``docs/groundtruth.md``.)

For every planted model (or ``--models``), task and ablation: the search (full grid) and exact greedy
head pruning at the selected configuration; writes ``table.csv``, ``table.md``, ``summary.json``,
``figures/*.svg``, ``report.html`` and the run directories (``runs/<model>/<task>/<ablation>/``) to
``--out``. Re-running the same command resumes from the run directories.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class GroundTruthSpecs:
    """What ``af1 groundtruth``'s command line names, read once (:func:`spec`)."""

    models: tuple[str, ...] | None
    tasks: tuple[str, ...]
    ablations: tuple[str, ...]
    n_prompts: int
    seed: int
    threshold: float
    target: float
    out: str
    progress: bool
    command: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from circuits.flags import add_flags
    from circuits.options import RunOptions
    from circuits.prompts.spec import PromptSpec
    from circuits.prune.config import PruneConfig
    from circuits.search.config import SearchConfig

    parser.add_argument("--models", default=None,
                        help="comma-separated planted zoo models (default: every model with a planted ground truth)")
    parser.add_argument("--tasks", default="add_sub", help="comma-separated tasks (default add_sub)")
    parser.add_argument("--ablations", default="cama,mean,zero",
                        help="comma-separated ablations after the wait block (default cama,mean,zero)")
    add_flags(parser, PromptSpec, ("n_prompts", "seed"))
    add_flags(parser, SearchConfig, ("threshold",))
    add_flags(parser, PruneConfig, ("target",))
    add_flags(parser, RunOptions, ("progress", "out"), defaults={"out": "runs/groundtruth"})


def split(text: str) -> tuple[str, ...]:
    """The items of a comma-separated flag value."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def spec(args: argparse.Namespace) -> GroundTruthSpecs:
    from circuits.commands.common import command_line

    return GroundTruthSpecs(models=split(args.models) if args.models else None, tasks=split(args.tasks),
                            ablations=split(args.ablations), n_prompts=args.n_prompts, seed=args.seed,
                            threshold=args.threshold, target=args.target, out=args.out,
                            progress=not args.no_progress, command=tuple(command_line(args)))


def check(spec: GroundTruthSpecs) -> None:
    """Model-independent checks, before anything is loaded."""
    from circuits.commands.common import MAX_PROMPTS, check_out
    from circuits.errors import ArgumentError
    from circuits.prompts.spec import check_prompt_count
    from circuits.tasks.catalogue import list_tasks
    from circuits.validation import check_fraction, check_positive
    from circuits.vocab import ABLATIONS

    check_fraction("--threshold", spec.threshold)
    check_fraction("--target", spec.target)
    check_positive("--n-prompts", spec.n_prompts, maximum=MAX_PROMPTS)
    bad = [a for a in spec.ablations if a not in ABLATIONS]
    if bad or not spec.ablations:
        raise ArgumentError(f"--ablations {','.join(spec.ablations)!r}: choose from {', '.join(ABLATIONS)}")
    unknown = [t for t in spec.tasks if t not in list_tasks()]
    if unknown or not spec.tasks:
        raise ArgumentError(f"--tasks {','.join(spec.tasks)!r}: unknown task(s) {unknown}; see "
                            f"circuits.tasks.list_tasks()")
    for task in spec.tasks:
        check_prompt_count(task, spec.n_prompts)
    check_out(spec.out)


def run(spec: GroundTruthSpecs) -> int:
    from circuits import report
    from circuits.destinations import Run
    from circuits.groundtruth.recovery import run_recovery
    from circuits.groundtruth.report import write_outputs

    with Run(spec.out, "groundtruth") as held:  # locked, and refused if another command's, before any model loads
        if report.plotlyjs_mode() == "directory":
            report.ensure_plotlyjs(spec.out)  # one plotly.js for the table's report and every run's
        rows = run_recovery(models=list(spec.models) if spec.models else None, tasks=list(spec.tasks),
                            n_prompts=spec.n_prompts, ablations=list(spec.ablations), out_dir=spec.out,
                            seed=spec.seed, threshold=spec.threshold, target=spec.target,
                            progress=spec.progress, log=print, held=held)
        paths = write_outputs(rows, spec.out, meta={"command": list(spec.command), "n_prompts": spec.n_prompts,
                                                    "threshold": spec.threshold, "target": spec.target})
    print()
    print(paths["md"].read_text())
    print(f"{sum(r.config_recovered for r in rows)}/{len(rows)} configurations and "
          f"{sum(r.heads_recovered for r in rows)}/{len(rows)} head sets recovered exactly; "
          f"table: {paths['md']}, report: {paths['html']}")
    return 0
