"""``af1 prune``: greedy head pruning of the transfer blocks inside one AF1 subgraph.

Loads the model, builds the task's evaluation prompts (answered correctly by the model, one layout),
fits the means on a fit set of the task without them (like the search; reused from ``--out`` when resuming),
and runs :func:`circuits.prune.prune_heads`. Re-running the same command continues an interrupted run.
``--from-search DIR`` takes the configuration from an ``af1 search`` run: the one it selected or, where it selected
none, its most faithful one with a transfer block (which heads matter there, even below the threshold).
"""

from __future__ import annotations

import argparse

from circuits.commands.common import CommandSpecs, add_common_arguments, check_config, check_specs, specs_of
from circuits.errors import ArgumentError
from circuits.flags import add_flags, values
from circuits.prune.config import PruneConfig

FLAGS = ("wait", "transfer", "target", "method", "ablation", "rank", "confirm_top")
"""The :class:`~circuits.prune.config.PruneConfig` fields ``af1 prune`` sets (``--seed`` sets ``seed`` too)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    add_flags(parser, PruneConfig, FLAGS, helps={
        "wait": "last waiting block (0-indexed; -1 = no ablation); required unless --from-search gives it",
        "transfer": "number of transfer blocks (>= 1); required unless --from-search gives it"})
    parser.add_argument("--from-search", metavar="DIR", default=None,
                        help="take --wait and --transfer from an af1 search run directory: the configuration it "
                             "selected or, if it selected none, its most faithful one with a transfer block")


def spec(args: argparse.Namespace) -> CommandSpecs:
    wait, transfer = args.wait, args.transfer
    if args.from_search is not None:
        if wait is not None or transfer is not None:
            raise ArgumentError("give --from-search DIR or --wait/--transfer, not both")
        wait, transfer = configuration_of_search(args.from_search, args.model, args.task, args.ablation)
    elif wait is None or transfer is None:
        raise ArgumentError("give --wait W --transfer T (the AF1 configuration whose transfer heads to prune), or "
                            "--from-search DIR to take them from an af1 search run")
    flags = {**values(PruneConfig, args, FLAGS), "wait": wait, "transfer": transfer}
    return specs_of(args, PruneConfig(**flags, seed=args.seed))


def configuration_of_search(run_dir: str, model: str | None, task: str | None, ablation: str) -> tuple[int, int]:
    """``(wait, transfer)`` of the ``af1 search`` run in ``run_dir``: its selected configuration, else its most
    faithful one with at least one transfer block (logged, with its faithfulness). Refuses (one line) a folder that
    is not a search run, a search of another model, task or ablation, and a selection without transfer heads."""
    from pathlib import Path

    from circuits.logs import get_logger
    from circuits.search.results import SearchResult
    from circuits.store import files
    from circuits.store.runs import read_json_object

    folder = Path(run_dir)
    if not (folder / files.SUMMARY).is_file():
        raise ArgumentError(f"--from-search {run_dir}: no {files.SUMMARY} there; give the --out folder of a finished "
                            f"af1 search")
    identity = read_json_object(folder / files.IDENTITY)
    for name, given in (("model", model), ("task", task), ("ablation", ablation)):
        found = identity.get(name)
        if given is not None and found is not None and found != given:
            raise ArgumentError(f"--from-search {run_dir}: that search ran with {name} {found}, not {given}: "
                                f"give --{name} {found}")
    result = SearchResult.load(folder)
    chosen = result.selected
    if chosen is None:
        chosen = result.most_faithful(min_transfer=1)
        if chosen is None:
            raise ArgumentError(f"--from-search {run_dir}: the search evaluated no configuration with a transfer "
                                f"block; give --wait and --transfer")
        get_logger("prune").info(
            "the search in %s selected no configuration at threshold %g: pruning its most faithful one, wait=%d, "
            "transfer=%d (faithfulness %.3f)", run_dir, result.threshold, chosen.wait, chosen.transfer,
            chosen.faithfulness)
    elif chosen.transfer < 1:
        raise ArgumentError(f"--from-search {run_dir}: the search selected wait={chosen.wait} with no transfer block, "
                            f"which has no transfer heads to prune; give --wait and --transfer")
    return chosen.wait, chosen.transfer


def check(spec: CommandSpecs) -> None:
    """Model-independent checks, before anything is loaded (:class:`~circuits.errors.ArgumentError` naming the
    bad value): the config (``--wait``/``--transfer`` against the model's number of blocks, read from its
    ``config.json`` before any weight loads, when the checkpoint is here), and what a remote model cannot do."""
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
