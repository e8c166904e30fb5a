"""The ``af1`` command line.

Each sub-command lives in its own module which exposes ``add_arguments(parser)``, optionally
``check(args)`` (model-independent checks, run before anything is loaded) and ``run(args) -> int``;
modules are imported only when their command runs, so ``af1 --help`` stays fast.

Every expected failure (see :func:`describe`) ends as one line on stderr, ``af1 COMMAND: error: ...``, and
exit code 2; anything else as one line naming the exception and exit code 1. ``--debug`` (anywhere on
the command line) prints the traceback too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from typing import Sequence

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("circuits.commands.demo", "run the main job (AF1 search) on the embedded default model"),
    "zoo": ("circuits.commands.zoo", "list, evaluate or retrain the embedded arithmetic models"),
    "search": ("circuits.commands.search", "AF1 search: latest wait and shortest transfer that stay faithful"),
    "necessity": ("circuits.commands.necessity", "per block, cut the last token's attention to earlier tokens"),
    "prune": ("circuits.commands.prune", "greedy head pruning of the transfer blocks inside an AF1 subgraph"),
    "lens": ("circuits.commands.lens", "early decoding (logit lens) after every attention and MLP sub-layer"),
    "sweep": ("circuits.commands.sweep", "models x tasks x ablations x seeds: the comparison tables, resumable"),
    "groundtruth": ("circuits.commands.groundtruth",
                    "search + pruning on the planted zoo models, scored against the planted structure"),
}

THREADS_ENV = "AF1_THREADS"
"""Environment variable giving torch's CPU threads when ``--threads`` is not given."""

MAX_MESSAGE = 400
"""Longest error message printed (characters); longer ones (e.g. a loader's list of every model name)
are cut."""


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
        p.set_defaults(_module=module)
    return parser


def describe(err: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit code 2)`` for an expected failure, ``None`` for anything else.

    Expected: the project's errors (:mod:`circuits.errors`, :mod:`interventions.types`; ``ValueError``
    subclasses), bad arguments, OS errors on files (permission, missing, not a directory, disk full), a
    corrupt or foreign file (safetensors, JSON), running out of device memory, and Ctrl-C.
    """
    import json

    from circuits.errors import AF1Error

    # interventions.types imports torch: an error of it can only come once it is imported.
    types = sys.modules.get("interventions.types")
    if isinstance(err, AF1Error) or types is not None and isinstance(err, types.InterventionNotAppliedError):
        return one_line(err), 2
    if isinstance(err, KeyboardInterrupt):
        return "interrupted; finished results are saved: run the same command again to resume", 2
    if isinstance(err, json.JSONDecodeError):
        return f"a JSON file is malformed ({err}); move it away or use a new --out directory", 2
    if isinstance(err, (ValueError, OSError, LookupError)) and not isinstance(err, (IndexError, KeyError)):
        return one_line(err), 2
    name = type(err).__name__
    if name == "SafetensorError":
        return f"a .safetensors file is corrupt or truncated ({err}); move it away or use a new --out directory", 2
    if name == "RemoteError":  # nnsight: the NDIF job failed (not imported here)
        return (f"the remote (NDIF) request failed: {one_line(err)}; finished results are saved: run the same "
                f"command again to resume"), 2
    if name == "OutOfMemoryError":
        return ("out of device memory: lower --batch-size, use --batch-size auto (halves it and retries) or a "
                "smaller --dtype"), 2
    return None


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


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

    cli_handler()  # the library's messages (logging, logger "circuits"): information on stdout, warnings on stderr
    try:
        set_threads(getattr(args, "threads", None) if args.command != "zoo" else None)
        module = importlib.import_module(args._module)
        if hasattr(module, "check"):
            module.check(args)
        return int(module.run(args) or 0)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - the one place errors become messages
        if debug:
            traceback.print_exc()
        known = describe(err)
        if known is not None:
            print(f"af1 {args.command}: error: {known[0]}", file=sys.stderr)
            return known[1]
        print(f"af1 {args.command}: internal error: {type(err).__name__}: {one_line(err)} (run with --debug for "
              f"the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
