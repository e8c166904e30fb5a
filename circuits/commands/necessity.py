"""``af1 necessity``: per block, cut the last token's attention to earlier tokens and measure faithfulness.

Writes ``necessity.jsonl`` (resumable), ``necessity.json`` and ``report.html`` (bar chart) to ``--out``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from circuits.commands.common import (
    add_common_arguments, check_common, evaluate_batched, first_batch_size, meta_of, prepare,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def check(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded."""
    check_common(args)


def run(args: argparse.Namespace) -> int:
    from circuits.necessity import NECESSITY, NecessityConfig
    from circuits.prepared import prepared_of
    from circuits.runner import Run, execute

    config = NecessityConfig(seed=args.seed, batch_size=first_batch_size(args)).validate()
    with Run(args.out, "necessity") as held:
        model, prompts = prepare(args, out=held.path)
        result = evaluate_batched(args, model, prompts.tokens, lambda batch_size: execute(
            NECESSITY, model, prompts.tokens, prompts.answers, replace(config, batch_size=batch_size),
            out_dir=args.out, held=held, meta=meta_of(args, prompts), progress=not args.no_progress,
            prepared=prepared_of(prompts)))
    print(result.table())
    print(f"{result.n_prompts} prompts, {result.seconds:.1f} s; report: {args.out}/report.html")
    return 0
