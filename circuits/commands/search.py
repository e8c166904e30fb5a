"""``af1 search``: find the AF1 configuration (latest wait, shortest transfer) of a model on a task.

Writes ``results.jsonl`` (one line per configuration, as soon as it is known), ``prompts.jsonl``,
``means.safetensors``, ``summary.json`` and ``report.html`` (faithfulness heatmap) to ``--out``.
Re-running the same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import CommandSpecs, add_common_arguments, check_config, check_specs, specs_of
from circuits.flags import add_flags, values
from circuits.search.config import SearchConfig

FLAGS = ("threshold", "grid", "ablation", "method", "configs_per_pass")
"""The :class:`~circuits.search.config.SearchConfig` fields ``af1 search`` sets (``--seed`` sets ``seed`` too)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    add_flags(parser, SearchConfig, FLAGS)


def spec(args: argparse.Namespace) -> CommandSpecs:
    return specs_of(args, SearchConfig(**values(SearchConfig, args, FLAGS), seed=args.seed))


def check(spec: CommandSpecs) -> None:
    """Model-independent checks, before anything is loaded."""
    check_specs(spec)
    check_config(spec.config)


def run(spec: CommandSpecs) -> int:
    from circuits.search.analysis import SEARCH

    result = spec.run(SEARCH)
    print(result.table())
    print(result.summary_line())
    if result.n_resumed:
        print(f"resumed {result.n_resumed} configuration(s) from {spec.out}/results.jsonl")
    print(f"{len(result.results)} configurations, searched in {result.seconds:.1f} s (the search alone; the last "
          f"line times the whole command); report: {spec.out}/report.html")
    return 0
