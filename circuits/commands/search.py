"""``af1 search``: find the AF1 configuration (latest wait, shortest transfer) of a model on a task.

Writes ``results.jsonl`` (one line per configuration, as soon as it is known), ``prompts.jsonl``,
``means.safetensors``, ``summary.json`` and ``report.html`` (faithfulness heatmap) to ``--out``.
Re-running the same command resumes an interrupted run.
"""

from __future__ import annotations

import argparse


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    """``--backend hooked|bridge`` (default: hooked on TransformerLens 3.x, bridge on 4.x) and ``--dtype``."""
    parser.add_argument("--backend", choices=("hooked", "bridge"), default=None,
                        help="TransformerLens model class: hooked (HookedTransformer, 3.x) or bridge "
                             "(TransformerBridge); default hooked where it exists, else bridge")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                        help="weight dtype of a pretrained model (default float32; zoo models: float32 only)")


def add_common_arguments(parser: argparse.ArgumentParser, *, n_prompts: int = 200) -> None:
    """Model / task / prompt / device options shared by the search-like commands."""
    parser.add_argument("--model", required=True,
                        help="zoo model name (see circuits.zoo), or a HuggingFace/TransformerLens name "
                             "loaded with HookedTransformer.from_pretrained / TransformerBridge.boot_transformers "
                             "(needs local weights or network)")
    parser.add_argument("--task", required=True, help="task name (see circuits.tasks.list_tasks())")
    parser.add_argument("--n-prompts", type=int, default=n_prompts,
                        help=f"evaluation prompts the model answers correctly, one layout (default {n_prompts})")
    parser.add_argument("--source", choices=("build", "frozen"), default="build",
                        help="prompts generated with --seed (build, default) or the task's frozen set")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and bootstrap CIs (default 0)")
    parser.add_argument("--batch-size", type=int, default=128, help="prompts per forward pass (default 128)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_backend_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--out", required=True, help="output directory (created; re-run to resume)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="faithfulness a configuration needs, a fraction in [0, 1] (default 0.9)")
    parser.add_argument("--grid", choices=("auto", "full"), default="auto",
                        help="full: every (wait, transfer) for the heatmap; auto (default): only what the "
                             "selection needs (same selection)")
    parser.add_argument("--ablation", choices=("cama", "mean", "zero"), default="cama",
                        help="ablation after the wait block: cama (default) or the mean/zero baselines")
    parser.add_argument("--method", choices=("fast", "naive"), default="fast",
                        help="fast (default, exact shortcuts) or naive (one full forward per configuration)")


def prepare(args: argparse.Namespace):
    """Load the model and the prompts named by ``args``; prints what it uses."""
    from circuits.loading import load_model, prepare_prompts

    model = load_model(args.model, device=args.device, backend=args.backend, dtype=args.dtype)
    prompts = prepare_prompts(model, args.task, args.n_prompts, args.seed, source=args.source)
    print(
        f"{args.model} on {args.task}: base accuracy {prompts.base_accuracy:.1%} "
        f"({prompts.n_correct}/{prompts.n_checked} checked prompts); using {len(prompts)} prompts of "
        f"{prompts.tokens.shape[1]} tokens ({prompts.n_layouts} layout(s))"
    )
    return model, prompts


def meta_of(args: argparse.Namespace, prompts) -> dict:
    return {
        "model": args.model,
        "task": args.task,
        "source": args.source,
        "base_accuracy": prompts.base_accuracy,
        "n_checked": prompts.n_checked,
        "command": command_line(args),
    }


def command_line(args: argparse.Namespace) -> list[str]:
    """The command as an argv list (``af1 <command> --option value ...``), rebuilt from ``args``."""
    out = ["af1", str(args.command)]
    for key, value in vars(args).items():
        if key.startswith("_") or key == "command" or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def run(args: argparse.Namespace) -> int:
    from circuits.search import search_af1

    model, prompts = prepare(args)
    result = search_af1(
        model, prompts.tokens, prompts.answers,
        threshold=args.threshold, grid=args.grid, ablation=args.ablation, out_dir=args.out, seed=args.seed,
        batch_size=args.batch_size, progress=not args.no_progress, method=args.method,
        meta=meta_of(args, prompts), prompts=prompts.records(),
    )
    print(result.table())
    print(result.summary_line())
    if result.n_resumed:
        print(f"resumed {result.n_resumed} configuration(s) from {args.out}/results.jsonl")
    print(f"{len(result.results)} configurations in {result.seconds:.1f} s; report: {args.out}/report.html")
    return 0
