"""``af1 edges``: position-aware edge attribution (EAP / EAP-IG) and the faithfulness of its top-edge circuits.

Loads the model, builds the task's prompts (answered correctly by the model, one layout), fits the
counterfactual's means on a fit set without them (``--counterfactual cama``/``mean``), scores every edge
and evaluates the circuits of MIB's sizes by edge patching. Writes ``edges.npz`` (one row per edge),
``edges.json``, ``mib.json`` (MIB's circuit-track format) and ``report.html`` to ``--out``. Before the model loads
it logs the graph's edges and memory and refuses a run that cannot fit (:mod:`circuits.edges.plan`). A killed run
resumes when the same command is run again (:mod:`circuits.edges.resume`: the score sums of the batches done, the
circuits of the curve evaluated); other settings into a used directory are refused, naming the settings that
differ.
"""

from __future__ import annotations

import argparse

from circuits.commands.common import CommandSpecs, add_common_arguments, check_config, check_specs, specs_of
from circuits.edges.config import EdgesConfig
from circuits.flags import add_flags, values

FLAGS = ("method", "steps", "ig_path", "counterfactual", "aggregate_positions", "wait", "transfer", "curve", "top")
"""The :class:`~circuits.edges.config.EdgesConfig` fields ``af1 edges`` sets (``--seed`` sets ``seed`` too)."""


BATCH_SIZE = 16
"""Default prompts per pass: each pass runs a copy of every prompt per query position, so a batch holds
``batch * positions`` sequences (``--batch-size auto`` sizes it to the memory; an out-of-memory batch is halved)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, batch_size=BATCH_SIZE)
    add_flags(parser, EdgesConfig, FLAGS)


def spec(args: argparse.Namespace) -> CommandSpecs:
    return specs_of(args, EdgesConfig(**values(EdgesConfig, args, FLAGS), seed=args.seed))


def check(spec: CommandSpecs) -> None:
    """Model-independent checks, before anything is loaded: the config (``--wait``/``--transfer`` against the
    model's number of blocks when its ``config.json`` is here) and that the backend gives gradients."""
    from circuits.errors import ArgumentError
    from circuits.models.names import n_layers_of

    config: EdgesConfig = spec.config
    check_config(config, None if spec.model.remote else n_layers_of(spec.model.name))
    if spec.model.remote or spec.model.backend == "nnsight":
        raise ArgumentError("af1 edges takes gradients through the model's split inputs, which the nnsight backend "
                            "does not offer yet: use --backend hooked or bridge")
    check_specs(spec)


def run(spec: CommandSpecs) -> int:
    from circuits.edges.analysis import EDGES
    from circuits.edges.plan import plan_edges

    config: EdgesConfig = spec.config
    plan_edges(spec.model, spec.prompts, not config.aggregate_positions, spec.options.batch_size)  # before loading
    result = spec.run(EDGES)
    top = result.top(5)
    print("af1 edges: top edges: " + "; ".join(
        f"{e['src']}@{e['src_pos']} -> {e['dst']}@{e['dst_pos']} ({e['input']}) {e['score']:.3g}" for e in top))
    if result.curve is not None:
        c = result.curve
        print(f"af1 edges: CPR {c.cpr:.3f} [{c.cpr_ci[0]:.3f}, {c.cpr_ci[1]:.3f}], CMD {c.cmd:.3f} "
              f"[{c.cmd_ci[0]:.3f}, {c.cmd_ci[1]:.3f}] (edge patching, {len(c.points)} circuit sizes)")
    print(f"af1 edges: {len(result.table['score'])} edges scored in {result.seconds:.1f} s; results in {spec.out}")
    return 0
