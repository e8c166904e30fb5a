"""``af1 sweep``: models x tasks x ablations x seeds in one resumable command, with the tables.

``--config sweep.toml`` (see :mod:`circuits.sweep.config`) or the same as flags. Writes ``cells/`` (one
run directory per cell), ``table.csv``, ``table.md``, ``summary.json`` and ``report.html`` to ``--out``.
A sweep in which cells failed still writes them (with the failed rows and their errors), then exits with 2
and one line on stderr naming the failed cells.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuits.store import files


@dataclass(frozen=True)
class SweepSpecs:
    """What ``af1 sweep``'s command line names, read once (:func:`spec`): the sweep (``--config`` with the flags on
    top), the output directory, progress bars and the command line."""

    config: Any
    out: str
    progress: bool
    command: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from circuits.commands.common import BACKEND_FIELDS, add_model_arguments
    from circuits.flags import add_flags
    from circuits.options import RunOptions
    from circuits.prompts.spec import PromptSpec
    from circuits.search.config import FixedConfig, SearchConfig

    parser.add_argument("--config", default=None, help="TOML file with a [sweep] table (flags below override it)")
    parser.add_argument("--models", default=None, help="comma-separated model names")
    parser.add_argument("--tasks", default=None, help="comma-separated tasks or groups (original, style)")
    parser.add_argument("--ablations", default=None, help="comma-separated: cama, mean, zero (default cama)")
    parser.add_argument("--seeds", default=None, help="comma-separated integer seeds (default 0)")
    add_flags(parser, PromptSpec, ("n_prompts",), defaults={"n_prompts": None},
              helps={"n_prompts": "prompts per cell (default 200)"})
    add_flags(parser, FixedConfig, ("wait", "transfer"))
    add_flags(parser, SearchConfig, ("threshold",), defaults={"threshold": None},
              helps={"threshold": "search: faithfulness needed (default 0.9)"})
    parser.add_argument("--necessity", action="store_true", help="also run the necessity sweep per cell")
    parser.add_argument("--lens", action="store_true", help="also run early decoding per cell")
    add_flags(parser, RunOptions, ("batch_size",), helps={"batch_size": "prompts per forward pass (default 128)"})
    add_model_arguments(parser, ("device", *BACKEND_FIELDS), device=None)
    add_flags(parser, RunOptions, ("progress", "out"), required=("out",))


def spec(args: argparse.Namespace) -> SweepSpecs:
    """The sweep of ``--config`` with the flags applied on top (:func:`read_config`), and how to run it."""
    from circuits.commands.common import command_line

    return SweepSpecs(config=read_config(args), out=args.out, progress=not args.no_progress,
                      command=tuple(command_line(args)))


def read_config(args: argparse.Namespace) -> Any:
    """The :class:`~circuits.sweep.SweepConfig` of ``--config`` with the flags applied on top."""

    from circuits.errors import ArgumentError
    from circuits.sweep import SweepConfig
    from circuits.sweep.config import config_tasks
    from circuits.tasks.files import toml_module
    from circuits.tasks.package_data import find_file

    tomllib = toml_module()

    raw: dict = {}
    if args.config is not None:
        path = find_file(args.config)  # as --task finds a file: here, else the shipped examples
        if not path.is_file():
            raise ArgumentError(f"--config {args.config}: no such file (from the working directory, the data "
                                f"folder or the installed package, e.g. circuits/sweep/examples/styles.toml)")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ArgumentError(f"--config {args.config} is not UTF-8 text (byte {err.start}): TOML files are "
                                f"UTF-8") from None
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ArgumentError(f"--config {args.config} is not valid TOML: {err}") from None
        sweep = table.get("sweep")
        if sweep is not None and not isinstance(sweep, dict):
            raise ArgumentError(f"--config {args.config}: sweep must be a [sweep] table")
        raw = config_tasks(dict(sweep or {}), path)
    for key in ("models", "tasks", "ablations"):
        if getattr(args, key) is not None:
            raw[key] = [x.strip() for x in getattr(args, key).split(",") if x.strip()]
    if args.seeds is not None:
        try:
            raw["seeds"] = [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            raise ArgumentError(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 42,123,999") from None
    if args.remote:
        raw["remote"] = True
    for key in ("n_prompts", "wait", "transfer", "threshold", "batch_size", "device", "backend", "dtype", "device_map",
                "max_memory"):
        if getattr(args, key) is not None:
            raw[key] = getattr(args, key)
    if args.wait is not None or args.transfer is not None:
        raw["mode"] = "fixed"
    for key in ("necessity", "lens"):
        if getattr(args, key):
            raw[key] = True
    return SweepConfig.from_mapping(raw)


def check_fixed_range(config) -> None:
    """``--wait``/``--transfer`` against every model's number of blocks, read from its ``config.json``."""
    from circuits.errors import ArgumentError
    from circuits.models.names import n_layers_of
    from circuits.vocab import config_problem

    for model in config.models:
        n = n_layers_of(model)
        if n is not None and config.wait is not None and config.transfer is not None:
            problem = config_problem(n, config.wait, config.transfer)
            if problem is not None:
                raise ArgumentError(f"{model} has {n} blocks: {problem}")


def check(spec: SweepSpecs) -> None:
    """Model-independent checks, before anything is loaded."""
    from circuits.commands.common import check_backend, check_device, check_out

    config = spec.config
    # Model names are not refused here: a model that fails to load is one failed cell, the others run (its
    # load fails at once when the name can only be a mistake: circuits.models.names).
    if config.mode == "fixed":
        check_fixed_range(config)
    check_backend(config.remote, config.backend, config.models, config.batch_size, config.device_map)
    check_device(config.device)
    check_out(spec.out)


def run(spec: SweepSpecs) -> int:
    from circuits.sweep.run import run_sweep

    rows = run_sweep(spec.config, spec.out, progress=spec.progress, command=list(spec.command))
    print(Path(spec.out, files.TABLE_MD).read_text())
    failed = [r for r in rows if r.status != "ok"]
    print(f"{len(rows)} cells, {len(failed)} failed; table: {spec.out}/table.md, report: {spec.out}/report.html")
    if failed:
        print(f"af1 sweep: error: {failed_line(failed, len(rows))}", file=sys.stderr)
        return 2
    return 0


def failed_line(failed: list, n: int, limit: int = 3) -> str:
    """``"k of n cells failed: why (model/task/ablation/seed S, ...); ..."``: cells that failed for the same reason
    share one statement of it, given before the cells (a model that cannot load fails each of its cells the same
    way, and a long list of cells must not cut off why), the first ``limit`` reasons named (the table holds every
    failed row with its error)."""
    from circuits.errors import MAX_MESSAGE

    reasons: dict[str, list[str]] = {}
    for r in failed:
        reasons.setdefault(str(r.error), []).append(f"{r.model}/{r.task}/{r.ablation}/seed {r.seed}")
    named = "; ".join(f"{why} ({', '.join(cells)})" for why, cells in list(reasons.items())[:limit])
    more = f"; and {len(reasons) - limit} more reasons" if len(reasons) > limit else ""
    line = f"{len(failed)} of {n} cells failed: {named}{more} (see table.md)"
    cut = "... (see table.md)"
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - len(cut)] + cut
