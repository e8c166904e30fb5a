"""``af1 necessity``: per block, cut the last token's attention to earlier tokens and measure faithfulness.

Writes ``necessity.jsonl`` (resumable), ``necessity.json`` and ``report.html`` (bar chart) to ``--out``.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import add_common_arguments, check_common, specs_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def check(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded."""
    check_common(args)


def run(args: argparse.Namespace) -> int:
    from circuits.necessity import NECESSITY, NecessityConfig

    specs = specs_of(args)
    result = specs.run(NECESSITY, NecessityConfig(seed=args.seed))
    print(result.table())
    print(f"{result.n_prompts} prompts, {result.seconds:.1f} s; report: {specs.out}/report.html")
    return 0
