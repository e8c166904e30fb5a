"""The ``af1`` command line.

Each sub-command lives in its own module which exposes ``add_arguments(parser)``, ``spec(args)`` (the one place
the parsed arguments are read: the command's specs, a frozen value), ``check(spec)`` (model-independent checks, run
before anything is loaded) and ``run(spec) -> int``. The modules declare their flags on the fields of the specs and
configs they set (:mod:`circuits.flags`) and import torch only when their command runs, so ``af1 --help`` stays
fast.

Every expected failure (the project's errors, OS errors, out of memory, Ctrl-C: see
:func:`circuits.errors.describe`) ends as one line on stderr, ``af1 COMMAND: error: ...``, and exit code 2;
anything else is a bug: one line ``af1 COMMAND: internal error: ...`` naming the exception and pointing to
``--debug``, and exit code 1. ``--debug`` (anywhere on the command line) prints the traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

from circuits.errors import describe, internal_error

__all__ = ["COMMANDS", "build_parser", "describe", "main"]

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("circuits.commands.demo", "run the main job (AF1 search) on the embedded default model"),
    "zoo": ("circuits.commands.zoo", "list, evaluate or retrain the embedded arithmetic models"),
    "search": ("circuits.commands.search", "AF1 search: latest wait and shortest transfer that stay faithful"),
    "necessity": ("circuits.commands.necessity", "per block, cut the last token's attention to earlier tokens"),
    "prune": ("circuits.commands.prune", "greedy head pruning of the transfer blocks inside an AF1 subgraph"),
    "edges": ("circuits.commands.edges", "position-aware edge attribution (EAP/EAP-IG) and edge-patching circuits"),
    "lens": ("circuits.commands.lens", "early decoding (logit lens) after every attention and MLP sub-layer"),
    "sweep": ("circuits.commands.sweep", "models x tasks x ablations x seeds: the comparison tables, resumable"),
    "groundtruth": ("circuits.commands.groundtruth",
                    "search + pruning on the planted zoo models, scored against the planted structure"),
}

THREADS_ENV = "AF1_THREADS"
"""Environment variable giving torch's CPU threads when ``--threads`` is not given."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="af1",
        description="Circuit discovery for mental arithmetic (AF1: CAMA, attention peeking, head pruning).",
    )
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the traceback of an error")
    return parser


def set_threads(threads: int | None) -> None:
    """torch's CPU threads for the command: ``--threads``, else ``$AF1_THREADS``, else torch's default (one per
    physical core). On a machine whose cores other processes keep busy, one thread is several times faster than
    two (docs/real_models.md, "Speed"). :class:`~circuits.errors.ArgumentError` for a value below 1."""
    import os

    from circuits.errors import ArgumentError

    flag = "--threads"
    if threads is None:
        text = os.environ.get(THREADS_ENV, "").strip()
        if not text:
            return
        flag = f"${THREADS_ENV}"
        try:
            threads = int(text)
        except ValueError:
            raise ArgumentError(f"{flag}={text!r} is not an integer: set it to the number of torch CPU threads, "
                                f"e.g. 1") from None
    if threads < 1:
        raise ArgumentError(f"{flag} {threads} is out of range: give an integer >= 1")
    import torch

    torch.set_num_threads(int(threads))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    debug = bool(getattr(args, "debug", False))
    from circuits.logs import cli_handler

    # the library's messages (logging, logger "circuits"): information on stdout, warnings on stderr; --debug: all
    cli_handler(logging.DEBUG if debug else logging.INFO)
    try:
        set_threads(getattr(args, "threads", None) if args.command != "zoo" else None)
        module = importlib.import_module(COMMANDS[args.command][0])
        spec = module.spec(args)
        module.check(spec)
        return int(module.run(spec) or 0)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the one place every failure becomes one line
        if debug:
            traceback.print_exc()
        known = describe(err)
        if known is not None:
            print(f"af1 {args.command}: error: {known[0]}", file=sys.stderr)
            return known[1]
        print(f"af1 {args.command}: {internal_error(err)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
