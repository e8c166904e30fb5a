"""The ``af1`` command line.

Each sub-command lives in its own module which exposes ``add_arguments(parser)`` and ``run(args) -> int``;
modules are imported only when their command runs, so ``af1 --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("circuits.commands.demo", "run the main job (AF1 search) on the embedded default model"),
    "zoo": ("circuits.commands.zoo", "list, evaluate or retrain the embedded arithmetic models"),
    "search": ("circuits.commands.search", "AF1 search: latest wait and shortest transfer that stay faithful"),
    "necessity": ("circuits.commands.necessity", "per block, cut the last token's attention to earlier tokens"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="af1",
        description="Circuit discovery for mental arithmetic (AF1: CAMA, attention peeking, head pruning).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        # User errors: one clear line, no stack trace.
        print(f"af1 {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
