"""``af1 demo``: the main job, end to end: the AF1 search on the default zoo model.

Loads ``circuits.zoo.DEFAULT_MODEL``, builds a small set of correctly answered ``add_sub`` prompts,
evaluates the full (wait, transfer) grid with CAMA and prints, per wait, the smallest sufficient
transfer and the selected configuration; the heatmap is in ``<out>/report.html``. A necessity sweep
(``<out>/necessity/``) shows in which blocks the last token needs the other tokens, and a few lines show
the search recovering the structure planted in the ground-truth model ``arith-gpt2-gt-w2t2``
(``af1 groundtruth`` does it for every planted model, with pruning). Without the zoo it
runs the same search on a small randomly initialised model (answers = its own predictions) and says so.
"""

from __future__ import annotations

import argparse

DEMO_TASK = "add_sub"
DEMO_PROMPTS = 100
PLANTED_DEMO_MODEL = "arith-gpt2-gt-w2t2"
"""The ground-truth model whose planted structure the demo recovers in a few lines."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
    parser.add_argument("--n-prompts", type=int, default=DEMO_PROMPTS,
                        help=f"evaluation prompts (default {DEMO_PROMPTS})")
    parser.add_argument("--task", default=DEMO_TASK, help=f"task (default {DEMO_TASK})")
    parser.add_argument("--threshold", type=float, default=0.9, help="faithfulness threshold (default 0.9)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _random_model_prompts(n_prompts: int):
    from dataclasses import replace

    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuits.prompts.fitset import FitSet
    from circuits.prompts.sampling import self_answer_prompts

    cfg = HookedTransformerConfig(n_layers=6, d_model=64, d_head=16, n_heads=4, d_mlp=256, n_ctx=32, d_vocab=64,
                                  act_fn="gelu", normalization_type="LN", seed=0, initializer_range=0.2)
    model = HookedTransformer(cfg).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 9, (n_prompts + 1000, 8), generator=g)
    tokens[:, 0] = 0
    prompts = self_answer_prompts(model, tokens[:n_prompts], task="random")
    # The means' fit set: other prompts of the same random distribution (about 125 per position and token).
    return "random-gpt2-6", model, replace(prompts, fit=FitSet.given(tokens[n_prompts:]))


def run(args: argparse.Namespace) -> int:
    from circuits.commands.common import command_line
    from circuits.models.loading import load_model, zoo_names
    from circuits.prompts.spec import PromptSpec
    from circuits.search import search_af1

    names = zoo_names()
    if names:
        from circuits import zoo

        name = zoo.DEFAULT_MODEL
        model = load_model(name)
        prompts = PromptSpec(args.task, args.n_prompts).prepare(model, means="cama", progress=not args.no_progress)
        task = args.task
    else:
        print("af1 demo: the model zoo (circuits.zoo) is not installed; running the search on a small "
              "random 6-block model whose answers are its own predictions (a smoke run, not a finding)")
        name, model, prompts = _random_model_prompts(args.n_prompts)
        task = prompts.task
    print(f"model {name}, task {task}: base accuracy {prompts.base_accuracy:.1%}, {len(prompts)} prompts of "
          f"{prompts.tokens.shape[1]} tokens")
    result = search_af1(
        model, prompts.tokens, prompts.answers, fit=prompts.fit, threshold=args.threshold, grid="full",
        out_dir=args.out, progress=not args.no_progress, prompts=prompts.records(),
        meta={"model": name, "task": task, "source": prompts.source, "base_accuracy": prompts.base_accuracy,
              "n_checked": prompts.n_checked, "command": command_line(args)},
    )
    print()
    print(result.table())
    print(result.summary_line())
    print(f"{len(result.results)} configurations in {result.seconds:.1f} s; report: {args.out}/report.html")

    # Which blocks the last token needs to read the other tokens in (cheap: one pass per block).
    from pathlib import Path

    from circuits.necessity import necessity_sweep

    nec_dir = Path(args.out) / "necessity"
    nec = necessity_sweep(
        model, prompts.tokens, prompts.answers, out_dir=nec_dir, progress=not args.no_progress,
        meta={"model": name, "task": task, "source": prompts.source, "base_accuracy": prompts.base_accuracy,
              "n_checked": prompts.n_checked, "command": command_line(args)},
    )
    print()
    print("necessity: faithfulness when the last token reads only BOS and itself in one block")
    print(nec.table())
    print(f"report: {nec_dir}/report.html")
    if names:
        planted_demo(args)
    return 0


def planted_demo(args: argparse.Namespace, name: str = PLANTED_DEMO_MODEL, n_prompts: int = 60) -> None:
    """A few lines: the search (auto grid, CAMA) on a planted zoo model recovers its planted
    (wait, transfer). ``name`` if it is installed, else the first planted model there is (a mask held by
    hooks says so); skipped with a note when there is none."""
    from circuits.groundtruth.recovery import model_folder, planted_models, planted_structure
    from circuits.models.loading import load_model
    from circuits.prompts.spec import PromptSpec
    from circuits.search import search_af1
    from circuits.zoo.hf import read_meta

    planted = planted_models()
    if name not in planted:
        if not planted:
            print("\n(planted check skipped: no planted zoo model is installed)")
            return
        name = planted[0]
    how = ("learned in the weights" if "groundtruth" in read_meta(model_folder(name))
           else "held by attention-mask hooks, so recovery is by construction")
    s = planted_structure(name)
    model = load_model(name)
    prompts = PromptSpec(args.task, n_prompts).prepare(model, means="cama", progress=False)
    res = search_af1(model, prompts.tokens, prompts.answers, fit=prompts.fit, threshold=args.threshold, grid="auto",
                     progress=False, n_boot=200)
    got = res.selected.config if res.selected is not None else None
    print()
    print(f"planted check: {name} was trained with wait={s.wait}, transfer={s.transfer} (last position reads "
          f"through heads " + " ".join(f"L{b}H{h}" for b, h in sorted(s.head_set)) + f"; {how})")
    print(f"  search on {len(prompts)} {args.task} prompts: {res.summary_line()}")
    print(f"  {'recovered' if got == (s.wait, s.transfer) else 'NOT recovered'}; all planted models: "
          f"`af1 groundtruth` (docs/groundtruth.md)")
