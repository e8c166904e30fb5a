"""``af1 search``: find the AF1 configuration (latest wait, shortest transfer) of a model on a task.

Writes ``results.jsonl`` (one line per configuration, as soon as it is known), ``prompts.jsonl``,
``means.safetensors``, ``summary.json`` and ``report.html`` (faithfulness heatmap) to ``--out``.
Re-running the same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import add_common_arguments, check_common, specs_of
from circuits.validation import check_fraction, check_positive
from circuits.vocab import ABLATIONS, GRIDS, SEARCH_METHODS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="faithfulness a configuration needs, a fraction in [0, 1] (default 0.9)")
    parser.add_argument("--grid", choices=GRIDS, default="auto",
                        help="full: every (wait, transfer) for the heatmap; auto (default): only what the "
                             "selection needs (same selection)")
    parser.add_argument("--ablation", choices=ABLATIONS, default="cama",
                        help="ablation after the wait block: cama (default) or the mean/zero baselines")
    parser.add_argument("--method", choices=SEARCH_METHODS, default="fast",
                        help="fast (default, exact shortcuts) or naive (one full forward per configuration)")
    parser.add_argument("--configs-per-pass", type=int, default=8,
                        help="configurations of one wait evaluated in one forward pass where the backend allows "
                             "it (nnsight: one request each; default 8)")


def check(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded."""
    check_common(args)
    check_fraction("--threshold", args.threshold)
    check_positive("--configs-per-pass", args.configs_per_pass)


def run(args: argparse.Namespace) -> int:
    from circuits.search import SEARCH, SearchConfig

    specs = specs_of(args)
    result = specs.run(SEARCH, SearchConfig(threshold=args.threshold, grid=args.grid, ablation=args.ablation,
                                            method=args.method, seed=args.seed, configs_per_pass=args.configs_per_pass))
    print(result.table())
    print(result.summary_line())
    if result.n_resumed:
        print(f"resumed {result.n_resumed} configuration(s) from {specs.out}/results.jsonl")
    print(f"{len(result.results)} configurations in {result.seconds:.1f} s; report: {specs.out}/report.html")
    return 0
