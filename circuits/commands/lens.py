"""``af1 lens``: early decoding (logit lens) after every attention and MLP sub-layer, plus the interchange
check of the last-position attention output; writes ``lens.json`` and ``report.html`` into ``--out``."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from circuits.commands.search import add_backend_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model name (a zoo model such as arith-gpt2, or a "
                        "TransformerLens pretrained name)")
    parser.add_argument("--task", required=True, help="task name (see circuits.tasks.list_tasks())")
    parser.add_argument("--n-prompts", type=int, default=200, help="prompts to decode (default: 200)")
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling seed (default: 0)")
    parser.add_argument("--out", required=True, help="output directory (lens.json, report.html)")
    parser.add_argument("--decode", choices=("final_norm", "raw"), default="final_norm",
                        help="final_norm: ln_final then unembedding (default); raw: unembedding only")
    parser.add_argument("--top-k", type=int, default=10, help="k of the operand/operator visibility test (default: 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per forward pass (default: 64)")
    parser.add_argument("--no-interchange", action="store_true", help="skip the attention interchange check")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_backend_argument(parser)
    parser.add_argument("--force", action="store_true", help="overwrite an existing lens.json in --out")


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def interchange_sets(model: Any, task: str, prompts: list[str], answers: list[int], seed: int) -> list[Any]:
    """Counterfactual pair sets for every operand and every operator symbol of ``task``'s template."""
    from circuits import lens, tasks

    spec = tasks.get_task(task)
    rows = []
    for p, a in zip(prompts, answers):
        ops = lens.parse_operands(spec.template, spec.operand_names, p)
        if ops is not None:
            rows.append({"prompt": p, "answer": int(a), "operands": ops, "task": task})
    changes = [("operand", i, f"operand {name}") for i, name in enumerate(spec.operand_names)]
    n_ops = sum(re.sub(r"\{[^}]*\}", "", spec.template).count(c) for c in "+-")
    changes += [("operator", i, f"operator {i + 1}") for i in range(n_ops)]
    sets = []
    for change, index, label in changes:
        pairs = lens.counterfactual_rows(rows, change=change, index=index, seed=seed, spec=spec)
        try:
            sets.append(lens.counterfactual_set(model, pairs, label=label))
        except ValueError as err:
            print(f"af1 lens: skipping interchange '{label}': {err}")
    return sets


def run(args: argparse.Namespace) -> int:
    import torch

    from circuits import lens, loading
    from circuits.lens.report import write_lens_outputs

    if args.n_prompts < 1:
        raise ValueError(f"--n-prompts={args.n_prompts} must be >= 1")
    out = Path(args.out)
    if (out / "lens.json").exists() and not args.force:
        raise FileExistsError(f"{out / 'lens.json'} exists: choose another --out or pass --force")
    t0 = time.time()
    model = loading.load_model(args.model, args.device, backend=args.backend, dtype=args.dtype)
    prep = loading.prepare_prompts(model, args.task, args.n_prompts, args.seed)
    tokens, answers = _get(prep, "tokens"), _get(prep, "answers")
    prompts = list(_get(prep, "prompts"))
    values = _get(prep, "answer_values")
    values = [int(v) for v in values] if values is not None else None
    result = lens.early_decode(model, tokens, answers=torch.as_tensor(answers), answer_values=values,
                               prompts=prompts, decode=args.decode, top_k=args.top_k,
                               batch_size=args.batch_size)
    inter = []
    if not args.no_interchange and values is not None:
        for cf in interchange_sets(model, args.task, prompts, values or [], args.seed):
            res = lens.interchange(model, cf.tokens, cf.answers, cf.counter_tokens,
                                   counter_answers=cf.counter_answers, batch_size=args.batch_size, label=cf.label)
            inter.append(res)
    meta = {
        "model": args.model, "task": args.task, "seed": args.seed, "n_requested": args.n_prompts,
        "base_accuracy": _get(prep, "base_accuracy"), "runtime_s": None,
    }
    meta["runtime_s"] = round(time.time() - t0, 1)
    json_path, html_path = write_lens_outputs(out, result, interchanges=inter, meta=meta, seed=args.seed)
    rows = result.rows(n_boot=200)
    first = next((r for r in rows if r["answer_top1"] >= 0.5), None)
    print(f"af1 lens: {result.n_prompts} prompts, {len(rows)} sub-layers; answer top-1 for most prompts from "
          f"{first['label'] if first else 'nowhere'}; final answer_prob {rows[-1]['answer_prob']:.3f}")
    for r in inter:
        best = max(r.rows(), key=lambda x: x["drop"])
        print(f"af1 lens: interchange {r.label}: largest drop {best['drop']:.3f} at block {best['layer']} (n={len(r.clean_prob)})")
    print(f"af1 lens: wrote {json_path} and {html_path}")
    return 0
