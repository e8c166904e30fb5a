"""The ``af1`` command line.

Each sub-command lives in its own module which exposes ``add_arguments(parser)``, ``spec(args)`` (the one place
the parsed arguments are read: the command's specs, a frozen value), ``check(spec)`` (model-independent checks, run
before anything is loaded) and ``run(spec) -> int``. The modules declare their flags on the fields of the specs and
configs they set (:mod:`circuits.flags`) and import torch only when their command runs, so ``af1 --help`` stays
fast.

Every expected failure (the project's errors, OS errors, out of memory, Ctrl-C: see
:func:`circuits.errors.describe`) ends as one line on stderr, ``af1 COMMAND: error: ...``, and exit code 2;
anything else is a bug: one line ``af1 COMMAND: internal error: ...`` naming the exception and pointing to
``--debug``, and exit code 1. ``--debug`` (anywhere on the command line) prints the traceback too. SIGTERM ends a
command as Ctrl-C does (:func:`sigterm_as_interrupt`).

For scripts: ``--quiet`` (nothing on stdout, no progress bars; warnings and errors on stderr), ``--log-file FILE``
(everything the command writes appended to FILE as well, with its start time, exit code and wall time: see
:class:`circuits.logs.Transcript`), ``af1 --version``. A mistyped command gets one line naming the close ones.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from circuits.errors import describe, did_you_mean, internal_error

__all__ = ["COMMANDS", "build_parser", "describe", "main", "sigterm_as_interrupt", "unknown_command", "version_line"]

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
    "compare": ("circuits.commands.compare", "several runs' results side by side: one table and one figure"),
    "notebooks": ("circuits.commands.notebooks", "copy the example notebooks that ship with the package into a folder"),
    "cache": ("circuits.commands.cache", "list or clear the cached means and checked prompts later commands reuse"),
}

THREADS_ENV = "AF1_THREADS"
"""Environment variable giving torch's CPU threads when ``--threads`` is not given."""


def version_line() -> str:
    """``af1 --version``: the package's version and those of Python, torch and TransformerLens (read from the
    installed packages' metadata: nothing heavy is imported)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from circuits import __version__

    def installed(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return (f"af1 {__version__} (af1-circuits; Python {platform.python_version()}, torch {installed('torch')}, "
            f"transformer-lens {installed('transformer-lens')})")


def add_global_flags(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """``--debug``, ``--quiet`` and ``--log-file``, accepted before the command and after it (``suppress``: on a
    command's parser, where an absent flag must not override one given before the command)."""
    off: object = argparse.SUPPRESS if suppress else False
    parser.add_argument("--debug", action="store_true", default=off, help="print the traceback of an error")
    parser.add_argument("--quiet", action="store_true", default=off,
                        help="nothing on stdout and no progress bars (warnings and errors still on stderr)")
    parser.add_argument("--log-file", metavar="FILE", default=argparse.SUPPRESS if suppress else None,
                        help="append everything the command writes to FILE too, with its start time, exit code and "
                             "wall time (progress bars off)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="af1",
        description="Circuit discovery for mental arithmetic (AF1: CAMA, attention peeking, head pruning).",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the --version line unwrapped
    )
    parser.add_argument("--version", action="version", version=version_line())
    add_global_flags(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        for command in [p, *nested(p)]:  # `af1 zoo list --quiet` too
            add_global_flags(command, suppress=True)
    return parser


def nested(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The sub-command parsers of a command's parser (``zoo``: ``list``, ``train``, ``eval``), if it has any."""
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]


def unknown_command(argv: Sequence[str]) -> str | None:
    """The one-line error for a command line whose command is not one of :data:`COMMANDS` (with the close ones),
    ``None`` when it names a command or none."""
    words = iter(argv)
    for word in words:
        if word == "--log-file":
            next(words, None)  # its value
        elif not word.startswith("-"):
            if word in COMMANDS:
                return None
            return (f"unknown command {word!r}; {did_you_mean(word, list(COMMANDS))}commands: "
                    f"{', '.join(COMMANDS)} (af1 --help)")
    return None


def set_threads(threads: int | None) -> None:
    """torch's CPU threads for the command: ``--threads``, else ``$AF1_THREADS``, else torch's default (one per
    physical core). On a machine whose cores other processes keep busy, one thread is several times faster than
    two (docs/real_models.md, "Speed"). :class:`~circuits.errors.ArgumentError` for a value below 1 or above
    :func:`circuits.validation.max_threads` (4 per core)."""
    import os

    from circuits.errors import ArgumentError
    from circuits.validation import check_threads

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
    check_threads(flag, threads)
    import torch

    torch.set_num_threads(int(threads))


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a command runs, SIGTERM (``kill PID``, a batch system's time limit) ends it as Ctrl-C does: a
    :class:`~circuits.errors.Terminated` (a ``KeyboardInterrupt``) is raised where the command is, so the lock is
    released and ``.lock`` removed, the finished results stay, and the command prints the one "interrupted" line
    and exits with 2. A second SIGTERM while that unwinds is ignored (``kill -9`` still ends the process at
    once). Outside the main thread (where Python cannot take signals) nothing is changed."""
    import signal
    import threading

    from circuits.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(f"terminated by signal {signum} (SIGTERM)")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    unknown = unknown_command(words)
    if unknown is not None:
        print(f"af1: error: {unknown}", file=sys.stderr)
        return 2

    import time

    started = time.perf_counter()
    parser = build_parser()
    args = parser.parse_args(words)
    if args.command is None:
        parser.print_help()
        return 0
    debug = bool(getattr(args, "debug", False))
    quiet, log_file = bool(getattr(args, "quiet", False)), getattr(args, "log_file", None)
    if (quiet or log_file is not None) and hasattr(args, "no_progress"):
        args.no_progress = True  # bars would fill the log file; --quiet shows none
    from circuits.logs import Transcript, cli_handler

    # the library's messages (logging, logger "circuits"): information on stdout, warnings on stderr; --debug: all
    cli_handler(logging.DEBUG if debug else logging.INFO)
    try:
        transcript = Transcript(["af1", *words], quiet=quiet, log_file=log_file)
        with transcript:
            code = run_command(args, debug, started)
            transcript.end(code)
    except OSError as err:  # the log file cannot be written
        print(f"af1 {args.command}: error: --log-file {log_file}: {err.strerror or err}; give a writable file",
              file=sys.stderr)
        return 2
    return code


def run_command(args: argparse.Namespace, debug: bool, started: float) -> int:
    """The parsed command's ``spec``, ``check`` and ``run`` (``started``: ``time.perf_counter()`` when the command
    began, for its timing line); every failure as one line on stderr and its exit code."""
    try:
        with sigterm_as_interrupt():
            set_threads(getattr(args, "threads", None) if args.command != "zoo" else None)
            from circuits import timing

            module = importlib.import_module(COMMANDS[args.command][0])
            spec = module.spec(args)
            module.check(spec)
            with timing.command(started) as times:
                code = int(module.run(spec) or 0)
            if times.runs:
                print(times.line())  # where the whole command's time went, its last line
            return code
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
