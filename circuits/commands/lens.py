"""``af1 lens``: early decoding (logit lens) after every attention and MLP sub-layer, plus the interchange
check of the last-position attention output; writes ``lens.json`` and ``report.html`` into ``--out``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuits.commands.common import (
    CommandSpecs,
    add_model_arguments,
    add_prompt_arguments,
    check_config,
    check_specs,
    specs_of,
)
from circuits.flags import add_flags, values
from circuits.lens.config import LensConfig
from circuits.options import RunOptions
from circuits.store import files

FLAGS = ("decode", "top_k", "interchange")
"""The :class:`~circuits.lens.config.LensConfig` fields ``af1 lens`` sets (``--seed`` sets ``seed`` too)."""


@dataclass(frozen=True)
class LensSpecs:
    """``af1 lens``'s specs: the model command's, and whether a finished run may be overwritten (``--force``)."""

    specs: CommandSpecs
    force: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_prompt_arguments(parser, ("task", "prompts", "n_prompts", "seed", "prepend_bos", "numbers"), fit=False)
    add_flags(parser, RunOptions, ("out", "batch_size", "progress"), required=("out",), defaults={"batch_size": 64})
    add_flags(parser, LensConfig, FLAGS)
    parser.add_argument("--force", action="store_true", help="overwrite an existing lens.json in --out")


def interchange_sets(*args: Any, **kwargs: Any) -> list[Any]:
    """:func:`circuits.lens.analysis.interchange_sets` (kept importable here; imported lazily)."""
    from circuits.lens.analysis import interchange_sets as sets

    return sets(*args, **kwargs)


def spec(args: argparse.Namespace) -> LensSpecs:
    return LensSpecs(specs_of(args, LensConfig(**values(LensConfig, args, FLAGS), seed=args.seed)), bool(args.force))


def check(spec: LensSpecs) -> None:
    """Model-independent checks, before anything is loaded."""
    from circuits.errors import ArgumentError

    specs = spec.specs
    if specs.model.remote:
        raise ArgumentError("af1 lens decodes residual states here and needs the model's weights: run it without "
                            "--remote (early decoding of a model NDIF hosts is not supported)")
    check_specs(specs)
    check_config(specs.config)
    # A finished run is not overwritten without --force; one killed between lens.json and report.html is
    # redone (run.json, checked by the runner, tells whether it is this run).
    out = Path(specs.out)
    if (out / files.LENS).exists() and (out / files.REPORT).exists() and not spec.force:
        raise FileExistsError(f"{out / files.LENS} exists: choose another --out or pass --force")


def run(spec: LensSpecs) -> int:
    from circuits.lens.analysis import LENS

    result = spec.specs.run(LENS)
    out = Path(spec.specs.out)
    rows = result.rows(n_boot=200)
    first = next((r for r in rows if r["answer_top1"] >= 0.5), None)
    print(f"af1 lens: {result.n_prompts} prompts, {len(rows)} sub-layers; answer top-1 for most prompts from "
          f"{first['label'] if first else 'nowhere'}; final answer_prob {rows[-1]['answer_prob']:.3f}")
    for r in result.interchanges:
        best = max(r.rows(), key=lambda x: x["drop"])
        print(f"af1 lens: interchange {r.label}: largest drop {best['drop']:.3f} at block {best['layer']} "
              f"(n={len(r.clean_prob)})")
    print(f"af1 lens: wrote {out / 'lens.json'} and {out / 'report.html'}")
    return 0
