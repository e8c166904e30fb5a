"""``af1 lens``: early decoding (logit lens) after every attention and MLP sub-layer, plus the interchange
check of the last-position attention output; writes ``lens.json`` and ``report.html`` into ``--out``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from circuits.commands.common import (
    add_backend_argument,
    add_prompt_format_arguments,
    add_task_arguments,
    batch_size_argument,
    set_prompt_defaults,
)
from circuits.store import files
from circuits.vocab import DECODES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model name (a zoo model such as arith-gpt2, or a "
                        "TransformerLens pretrained name)")
    add_task_arguments(parser)
    parser.add_argument("--n-prompts", type=int, default=200, help="prompts to decode (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling seed (default: 0)")
    parser.add_argument("--out", required=True, help="output directory (lens.json, report.html)")
    parser.add_argument("--decode", choices=DECODES, default="final_norm",
                        help="final_norm: ln_final then unembedding (default); raw: unembedding only")
    parser.add_argument("--top-k", type=int, default=10, help="k of the operand/operator visibility test (default: 10)")
    parser.add_argument("--batch-size", type=batch_size_argument, default=64,
                        help="prompts per forward pass (default: 64; auto: the largest that fits)")
    parser.add_argument("--no-interchange", action="store_true", help="skip the attention interchange check")
    parser.add_argument("--prepend-bos", action=argparse.BooleanOptionalAction, default=None,
                        help="put BOS at position 0 (default: the model's own default; models that do not "
                             "prepend it, e.g. Pythia, need --prepend-bos)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_prompt_format_arguments(parser)
    add_backend_argument(parser)
    parser.add_argument("--force", action="store_true", help="overwrite an existing lens.json in --out")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    set_prompt_defaults(parser)


def interchange_sets(*args: Any, **kwargs: Any) -> list[Any]:
    """:func:`circuits.lens.analysis.interchange_sets` (kept importable here; imported lazily)."""
    from circuits.lens.analysis import interchange_sets as sets

    return sets(*args, **kwargs)


def check(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded."""
    from circuits.commands.common import check_specs, specs_of
    from circuits.validation import check_positive

    specs = specs_of(args)
    if specs.model.remote:
        from circuits.errors import ArgumentError

        raise ArgumentError("af1 lens decodes residual states here and needs the model's weights: run it without "
                            "--remote (early decoding of a model NDIF hosts is not supported)")
    check_specs(specs)
    check_positive("--top-k", args.top_k)
    # A finished run is not overwritten without --force; one killed between lens.json and report.html is
    # redone (run.json, checked by the runner, tells whether it is this run).
    out = Path(args.out)
    if (out / files.LENS).exists() and (out / files.REPORT).exists() and not args.force:
        raise FileExistsError(f"{out / files.LENS} exists: choose another --out or pass --force")


def run(args: argparse.Namespace) -> int:
    from circuits.commands.common import specs_of
    from circuits.lens.analysis import LENS, LensConfig

    specs = specs_of(args)
    result = specs.run(LENS, LensConfig(decode=args.decode, top_k=args.top_k, interchange=not args.no_interchange,
                                        seed=args.seed))
    out = Path(specs.out)
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
