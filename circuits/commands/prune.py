"""``af1 prune``: greedy head pruning of the transfer blocks inside one AF1 subgraph.

Loads the model, builds the task's evaluation prompts (answered correctly by the model, one layout),
fits the CAMA cache on them (``MeanCache.fit``, like the search; reused from ``--out`` when resuming),
and runs :func:`circuits.prune.prune_heads`. Re-running the same command continues an interrupted run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="zoo model name or a TransformerLens model name")
    parser.add_argument("--task", required=True, help="task name (see circuits.tasks.list_tasks())")
    parser.add_argument("--wait", type=int, required=True, help="last waiting block (0-indexed; -1 = no ablation)")
    parser.add_argument("--transfer", type=int, required=True, help="number of transfer blocks (>= 1)")
    parser.add_argument("--target", type=float, default=0.9, help="faithfulness target of the smallest head set (default 0.9)")
    parser.add_argument("--method", choices=("zero", "mean"), default="zero", help="how a head is removed (default zero)")
    parser.add_argument("--ablation", choices=("cama", "mean", "zero"), default="cama",
                        help="ablation of the residual after block --wait (default cama)")
    parser.add_argument("--rank", choices=("attribution", "none"), default="attribution",
                        help="rank candidates by attribution patching before confirming them (default attribution)")
    parser.add_argument("--confirm-top", type=int, default=None,
                        help="confirm only the K best-ranked candidates per step (default: all, exact greedy)")
    parser.add_argument("--n-prompts", type=int, default=200, help="evaluation prompts (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the task prompts and the bootstrap (default 0)")
    parser.add_argument("--batch-size", type=int, default=128, help="prompts per forward pass (default 128)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument("--out", required=True, help="output directory (created; an interrupted run resumes)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def check_arguments(args: argparse.Namespace) -> None:
    """Model-independent checks, before anything is loaded (``ValueError`` naming the bad value)."""
    if args.transfer < 1:
        raise ValueError(f"--transfer {args.transfer}: head pruning needs transfer heads, give --transfer >= 1")
    if args.wait < -1:
        raise ValueError(f"--wait {args.wait} is out of range: -1 (no ablation) or a 0-indexed block")
    if not 0.0 <= args.target <= 1.0:
        raise ValueError(f"--target {args.target} is out of range: a faithfulness fraction in [0, 1]")
    if args.n_prompts < 1:
        raise ValueError(f"--n-prompts {args.n_prompts} must be >= 1")
    if args.confirm_top is not None and args.confirm_top < 1:
        raise ValueError(f"--confirm-top {args.confirm_top} must be >= 1")
    if args.confirm_top is not None and args.rank != "attribution":
        raise ValueError("--confirm-top needs --rank attribution (--rank none confirms every candidate)")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be >= 1")


# --- PRIVATE STAND-INS for circuits.loading (load_model, prepare_prompts), which is being written on
# another branch; replace both with `from circuits.loading import load_model, prepare_prompts` once it is
# on main. ------------------------------------------------------------------------------------------


def load_model(name: str, device: str = "cpu") -> Any:
    try:
        from circuits import zoo
    except ImportError:
        zoo = None
    if zoo is not None and name in zoo.available():
        return zoo.load(name, device=device).eval()
    from transformer_lens import HookedTransformer

    try:
        return HookedTransformer.from_pretrained(name, device=device).eval()
    except Exception as err:  # noqa: BLE001 - one clear user error
        raise ValueError(f"cannot load model {name!r}: {type(err).__name__}: {err}") from err


def prepare_prompts(model: Any, task: str, n_prompts: int, seed: int = 0) -> Any:
    from types import SimpleNamespace

    import torch

    try:
        from circuits import tasks
    except ImportError as err:
        raise ValueError(f"the task catalogue (circuits.tasks) is not installed: {err}") from err
    ds = tasks.build_task(task, n=3 * n_prompts, seed=seed)
    ds, _ = tasks.filter_single_token(ds, model)
    ds, base_accuracy = tasks.filter_correct(model, ds)
    layouts = tasks.to_layouts(model, ds) if len(ds) else []
    if not layouts:
        raise ValueError(f"task {task!r}: the model answers none of the checked prompts correctly")
    best = max(layouts, key=lambda lay: int(lay.tokens.shape[0]))
    return SimpleNamespace(
        tokens=best.tokens[:n_prompts].long(),
        answers=torch.as_tensor(best.answers[:n_prompts], dtype=torch.long),
        prompts=list(best.prompts[:n_prompts]),
        answer_values=[int(v) for v in list(best.answer_values[:n_prompts])],
        base_accuracy=float(base_accuracy),
    )


# --- end of the stand-ins --------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    import torch

    import interventions as iv
    from circuits.prune import prune_heads

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = load_model(args.model, device)
    data = prepare_prompts(model, args.task, args.n_prompts, args.seed)
    cache = None
    if args.ablation in ("cama", "mean") or args.method == "mean":
        saved = Path(args.out) / "means.safetensors"
        if saved.exists():
            cache = iv.MeanCache.load(saved)
        else:
            cache = iv.MeanCache.fit(model, data.tokens, batch_size=args.batch_size, progress=not args.no_progress)
    result = prune_heads(
        model,
        data.tokens,
        data.answers,
        wait=args.wait,
        transfer=args.transfer,
        cache=cache,
        ablation=args.ablation,
        method=args.method,
        target=args.target,
        rank=args.rank,
        confirm_top=args.confirm_top,
        out_dir=args.out,
        progress=not args.no_progress,
        batch_size=args.batch_size,
        seed=args.seed,
        meta={"model": args.model, "task": args.task, "base_accuracy": data.base_accuracy},
        prompts=[{"prompt": p, "answer": a} for p, a in zip(data.prompts, data.answer_values)],
    )
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
