"""``af1 search``: find the AF1 configuration (latest wait, shortest transfer) of a model on a task.

Writes ``results.jsonl`` (one line per configuration, as soon as it is known), ``prompts.jsonl``,
``means.safetensors``, ``summary.json`` and ``report.html`` (faithfulness heatmap) to ``--out``.
Re-running the same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from circuits.commands.common import (  # noqa: F401 - re-exported: other commands and scripts import them here
    add_backend_argument, add_common_arguments, check_common, check_fraction, check_positive, command_line,
    evaluate_batched, first_batch_size, means_of, meta_of, prepare,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="faithfulness a configuration needs, a fraction in [0, 1] (default 0.9)")
    parser.add_argument("--grid", choices=("auto", "full"), default="auto",
                        help="full: every (wait, transfer) for the heatmap; auto (default): only what the "
                             "selection needs (same selection)")
    parser.add_argument("--ablation", choices=("cama", "mean", "zero"), default="cama",
                        help="ablation after the wait block: cama (default) or the mean/zero baselines")
    parser.add_argument("--method", choices=("fast", "naive"), default="fast",
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
    from circuits.runner import Run
    from circuits.search import SEARCH, SearchConfig
    from circuits.prepared import prepared_of
    from circuits.runner import execute

    config = SearchConfig(threshold=args.threshold, grid=args.grid, ablation=args.ablation, method=args.method,
                          seed=args.seed, batch_size=first_batch_size(args),
                          configs_per_pass=args.configs_per_pass).validate()
    with Run(args.out, "search") as held:
        model, prompts = prepare(args, means=means_of(args.ablation), out=held.path)
        if args.remote:  # --batch-size is a number with --remote (check_backend)
            from circuits.search.cost import search_cost

            n_prompts, n_pos = (int(v) for v in prompts.tokens.shape)
            print("remote cost: " + search_cost(model.cfg.n_layers, n_prompts, n_pos, batch_size=args.batch_size,
                                                configs_per_pass=args.configs_per_pass,
                                                n_fit=len(prompts.fit) if prompts.fit is not None else 0).line())
        result = evaluate_batched(args, model, prompts.tokens, lambda batch_size: execute(
            SEARCH, model, prompts.tokens, prompts.answers, replace(config, batch_size=batch_size), out_dir=args.out,
            held=held, fit=prompts.fit, meta=meta_of(args, prompts), prompts=prompts.records(), progress=not args.no_progress,
            prepared=prepared_of(prompts)))
    print(result.table())
    print(result.summary_line())
    if result.n_resumed:
        print(f"resumed {result.n_resumed} configuration(s) from {args.out}/results.jsonl")
    print(f"{len(result.results)} configurations in {result.seconds:.1f} s; report: {args.out}/report.html")
    usage = getattr(model, "usage", None)
    if args.remote and usage is not None:
        print(f"remote usage of this run (prompt preparation included): {usage.requests} requests, "
              f"{usage.tokens:,} prompt tokens")
    return 0
