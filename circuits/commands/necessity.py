"""``af1 necessity``: per block, cut the last token's attention to earlier tokens and measure faithfulness.

Writes ``necessity.jsonl`` (resumable), ``necessity.json`` and ``report.html`` (bar chart) to ``--out``.
"""

from __future__ import annotations

import argparse

from circuits.commands.search import add_common_arguments, command_line, prepare


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from circuits.necessity import necessity_sweep

    model, prompts = prepare(args)
    result = necessity_sweep(
        model, prompts.tokens, prompts.answers, out_dir=args.out, seed=args.seed, batch_size=args.batch_size,
        progress=not args.no_progress,
        meta={"model": args.model, "task": args.task, "source": args.source,
              "base_accuracy": prompts.base_accuracy, "n_checked": prompts.n_checked,
              "command": command_line(args)},
    )
    print(result.table())
    print(f"{result.n_prompts} prompts, {result.seconds:.1f} s; report: {args.out}/report.html")
    return 0
