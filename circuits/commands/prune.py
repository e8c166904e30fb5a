"""``af1 prune``: greedy head pruning of the transfer blocks inside one AF1 subgraph.

Loads the model, builds the task's evaluation prompts (answered correctly by the model, one layout),
fits the means on a fit set of the task without them (like the search; reused from ``--out`` when resuming),
and runs :func:`circuits.prune.prune_heads`. Re-running the same command continues an interrupted run.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import CommandSpecs, add_common_arguments, check_config, check_specs, specs_of
from circuits.flags import add_flags, values
from circuits.prune.config import PruneConfig

FLAGS = ("wait", "transfer", "target", "method", "ablation", "rank", "confirm_top")
"""The :class:`~circuits.prune.config.PruneConfig` fields ``af1 prune`` sets (``--seed`` sets ``seed`` too)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    add_flags(parser, PruneConfig, FLAGS, required=("wait", "transfer"))


def spec(args: argparse.Namespace) -> CommandSpecs:
    return specs_of(args, PruneConfig(**values(PruneConfig, args, FLAGS), seed=args.seed))


def check(spec: CommandSpecs) -> None:
    """Model-independent checks, before anything is loaded (:class:`~circuits.errors.ArgumentError` naming the
    bad value): the config (``--wait``/``--transfer`` against the model's number of blocks, read from its
    ``config.json`` before any weight loads, when the checkpoint is here), and what a remote model cannot do."""
    from circuits.errors import ArgumentError
    from circuits.models.names import n_layers_of

    config: PruneConfig = spec.config
    check_config(config, None if spec.model.remote else n_layers_of(spec.model.name))
    if spec.model.remote and config.rank == "attribution":
        raise ArgumentError("--rank attribution takes gradients through the model here, which a remote model cannot "
                            "give: add --rank none with --remote (every candidate is confirmed with forward passes)")
    check_specs(spec)


def run(spec: CommandSpecs) -> int:
    from circuits.prune.greedy import PRUNE

    result = spec.run(PRUNE)
    target = spec.config.target
    n_all = len(result.transfer_heads)
    if result.smallest_head_set is None:
        found = f"no head set reaches faithfulness {target} (unpruned: {result.curve[0].faithfulness:.3f})"
    else:
        found = (
            f"smallest head set with faithfulness >= {target}: {len(result.smallest_head_set)} of {n_all} "
            f"transfer heads (faithfulness {result.smallest_faithfulness:.3f}): "
            + " ".join(f"L{layer}H{head}" for layer, head in result.smallest_head_set)
        )
    print(f"af1 prune: {found}")
    print(
        f"af1 prune: AUC {result.auc:.3f}; {result.passes_total} confirmed passes "
        f"({result.passes_run} this run) + {result.attribution_passes_total} attribution passes; "
        f"pruning {result.seconds:.1f} s (the pruning alone; the last line times the whole command); results in "
        f"{spec.out}"
    )
    return 0
