"""``af1 prune``: greedy head pruning of the transfer blocks inside one AF1 subgraph.

Loads the model, builds the task's evaluation prompts (answered correctly by the model, one layout),
fits the means on a fit set of the task without them (like the search; reused from ``--out`` when resuming),
and runs :func:`circuits.prune.prune_heads`. Re-running the same command continues an interrupted run.
"""

from __future__ import annotations

import argparse

from circuits.vocab import ABLATIONS, HEAD_METHODS, RANKS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from circuits.commands.common import add_common_arguments

    add_common_arguments(parser)
    parser.add_argument("--wait", type=int, required=True, help="last waiting block (0-indexed; -1 = no ablation)")
    parser.add_argument("--transfer", type=int, required=True, help="number of transfer blocks (>= 1)")
    parser.add_argument("--target", type=float, default=0.9,
                        help="faithfulness the smallest head set must keep, a fraction in [0, 1] (default 0.9)")
    parser.add_argument("--method", choices=HEAD_METHODS, default="zero", help="how a head is removed (default zero)")
    parser.add_argument("--ablation", choices=ABLATIONS, default="cama",
                        help="ablation of the residual after block --wait (default cama)")
    parser.add_argument("--rank", choices=RANKS, default="attribution",
                        help="rank candidates by attribution patching before confirming them (default attribution)")
    parser.add_argument("--confirm-top", type=int, default=None,
                        help="confirm only the K best-ranked candidates per step (default: all, exact greedy)")


def check_arguments(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded (:class:`~circuits.errors.ArgumentError` naming the
    bad value)."""
    from circuits.commands.common import check_common
    from circuits.errors import ArgumentError
    from circuits.validation import check_fraction, check_int, check_positive

    if args.transfer < 1:
        raise ArgumentError(f"--transfer {args.transfer}: head pruning needs transfer heads, give --transfer >= 1")
    check_int("--wait", args.wait, -1)
    check_fraction("--target", args.target)
    if args.confirm_top is not None:
        check_positive("--confirm-top", args.confirm_top)
    if args.confirm_top is not None and args.rank != "attribution":
        raise ArgumentError("--confirm-top needs --rank attribution (--rank none confirms every candidate)")
    if args.remote and args.rank == "attribution":
        raise ArgumentError("--rank attribution takes gradients through the model here, which a remote model cannot "
                         "give: add --rank none with --remote (every candidate is confirmed with forward passes)")
    check_common(args)
    check_range(args)


def check_range(args: argparse.Namespace) -> None:
    """``--wait``/``--transfer`` against the model's number of blocks, read from its ``config.json`` (zoo,
    local folder or Hugging Face cache) before any weight loads; skipped when the config is not here."""
    from circuits.models.names import n_layers_of
    from circuits.prune.config import PruneConfig

    n = None if args.remote else n_layers_of(args.model)
    if n is not None:
        PruneConfig(wait=args.wait, transfer=args.transfer).validate(n)


check = check_arguments


def run(args: argparse.Namespace) -> int:
    from circuits.commands.common import specs_of
    from circuits.prune import PRUNE, PruneConfig

    specs = specs_of(args)
    result = specs.run(PRUNE, PruneConfig(args.wait, args.transfer, ablation=args.ablation, method=args.method,
                                          target=float(args.target), rank=args.rank, confirm_top=args.confirm_top,
                                          seed=args.seed))
    n_all = len(result.transfer_heads)
    if result.smallest_head_set is None:
        found = f"no head set reaches faithfulness {args.target} (unpruned: {result.curve[0].faithfulness:.3f})"
    else:
        found = (
            f"smallest head set with faithfulness >= {args.target}: {len(result.smallest_head_set)} of {n_all} "
            f"transfer heads (faithfulness {result.smallest_faithfulness:.3f}): "
            + " ".join(f"L{layer}H{head}" for layer, head in result.smallest_head_set)
        )
    print(f"af1 prune: {found}")
    print(
        f"af1 prune: AUC {result.auc:.3f}; {result.passes_total} confirmed passes "
        f"({result.passes_run} this run) + {result.attribution_passes_total} attribution passes; "
        f"{result.seconds:.1f} s; results in {args.out}"
    )
    return 0
