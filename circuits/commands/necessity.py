"""``af1 necessity``: per block, cut the last token's attention to earlier tokens and measure faithfulness.

Writes ``necessity.jsonl`` (resumable), ``necessity.json`` and ``report.html`` (bar chart) to ``--out``.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import CommandSpecs, add_common_arguments, check_specs, specs_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def spec(args: argparse.Namespace) -> CommandSpecs:
    from circuits.necessity import NecessityConfig

    return specs_of(args, NecessityConfig(seed=args.seed))


def check(spec: CommandSpecs) -> None:
    """Model-independent checks, before anything is loaded."""
    check_specs(spec)


def run(spec: CommandSpecs) -> int:
    from circuits.necessity import NECESSITY

    result = spec.run(NECESSITY)
    print(result.table())
    print(f"{result.n_prompts} prompts, necessity sweep {result.seconds:.1f} s (the sweep alone; the last line times "
          f"the whole command); report: {spec.out}/report.html")
    return 0
