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
from dataclasses import dataclass
from typing import Any

DEMO_TASK = "add_sub"
DEMO_PROMPTS = 100
PLANTED_DEMO_MODEL = "arith-gpt2-gt-w2t2"
"""The ground-truth model whose planted structure the demo recovers in a few lines."""


@dataclass(frozen=True)
class DemoSpecs:
    """What ``af1 demo``'s command line names, read once (:func:`spec`)."""

    out: str = "runs/demo"
    n_prompts: int = DEMO_PROMPTS
    task: str = DEMO_TASK
    threshold: float = 0.9
    progress: bool = True
    command: tuple[str, ...] = ("af1", "demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from circuits.flags import add_flags
    from circuits.options import RunOptions
    from circuits.prompts.spec import PromptSpec
    from circuits.search.config import SearchConfig

    add_flags(parser, RunOptions, ("out",), defaults={"out": DemoSpecs.out})
    add_flags(parser, PromptSpec, ("n_prompts", "task"), defaults={"n_prompts": DEMO_PROMPTS, "task": DEMO_TASK})
    add_flags(parser, SearchConfig, ("threshold",))
    add_flags(parser, RunOptions, ("progress",))


def spec(args: argparse.Namespace) -> DemoSpecs:
    from circuits.commands.common import command_line

    return DemoSpecs(out=args.out, n_prompts=args.n_prompts, task=args.task, threshold=args.threshold,
                     progress=not args.no_progress, command=tuple(command_line(args)))


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


def run(spec: DemoSpecs) -> int:
    from circuits import timing
    from circuits.models.loading import load_model, zoo_names
    from circuits.prompts import prepared
    from circuits.prompts.spec import PromptSpec

    names = zoo_names()
    if names:
        from circuits import zoo

        name = zoo.DEFAULT_MODEL
        with timing.phase("load"):
            model = load_model(name)
        with timing.phase("prompts"):  # reloaded from the results cache when an earlier command prepared them
            prompts = prepared.prepare(PromptSpec(spec.task, spec.n_prompts), model, means="cama", out=None,
                                       progress=spec.progress)
        task = spec.task
    else:
        print("af1 demo: the model zoo (circuits.zoo) is not installed; running the search on a small "
              "random 6-block model whose answers are its own predictions (a smoke run, not a finding)")
        name, model, prompts = _random_model_prompts(spec.n_prompts)
        task = prompts.task
    print(f"model {name}, task {task}: base accuracy {prompts.base_accuracy:.1%}, {len(prompts)} prompts of "
          f"{prompts.tokens.shape[1]} tokens")
    result = search_prepared(
        model, name, prompts, threshold=spec.threshold, grid="full", out=spec.out, progress=spec.progress,
        meta={"model": name, "task": task, "source": prompts.source, "base_accuracy": prompts.base_accuracy,
              "n_checked": prompts.n_checked, "command": list(spec.command)},
    )
    print()
    print(result.table())
    print(result.summary_line())
    print(f"{len(result.results)} configurations, searched in {result.seconds:.1f} s (the search alone; the last "
          f"line times the whole command); report: {spec.out}/report.html")

    # Which blocks the last token needs to read the other tokens in (cheap: one pass per block).
    from pathlib import Path

    from circuits.necessity import necessity_sweep

    nec_dir = Path(spec.out) / "necessity"
    nec = necessity_sweep(
        model, prompts.tokens, prompts.answers, out_dir=nec_dir, progress=spec.progress,
        meta={"model": name, "task": task, "source": prompts.source, "base_accuracy": prompts.base_accuracy,
              "n_checked": prompts.n_checked, "command": list(spec.command)},
    )
    print()
    print("necessity: faithfulness when the last token reads only BOS and itself in one block")
    print(nec.table())
    print(f"report: {nec_dir}/report.html")
    if names:
        planted_demo(spec)
    return 0


def search_prepared(model: Any, name: str, prompts: Any, *, threshold: float, grid: str, out: str | None,
                    progress: bool, meta: dict[str, Any], n_boot: int | None = None) -> Any:
    """:func:`circuits.search.search_af1` of ``prompts`` (a :class:`~circuits.prompts.Prompts`) with their
    prepared form, so the runner keeps them, with its check of which prompts the model answers, for the next
    command (the results cache) and reuses that check when they came from there."""
    import dataclasses
    from pathlib import Path

    from circuits.models.spec import LoadedModel
    from circuits.options import RunOptions
    from circuits.prompts.prepared import prepared_of
    from circuits.prompts.ready import ReadyPrompts
    from circuits.runner import run
    from circuits.search.analysis import SEARCH
    from circuits.search.config import SearchConfig

    config = SearchConfig(threshold=threshold, grid=grid)  # type: ignore[arg-type]
    if n_boot is not None:
        config = dataclasses.replace(config, n_boot=n_boot)
    ready = ReadyPrompts(tokens=prompts.tokens, answers=prompts.answers, fit=prompts.fit, records=prompts.records(),
                         meta=meta, prepared=prepared_of(prompts))
    result = run(SEARCH, config, LoadedModel(model, name=name), ready, RunOptions(out=out, progress=progress))
    result.out_dir = Path(out) if out is not None else None
    return result


def planted_demo(spec: DemoSpecs, name: str = PLANTED_DEMO_MODEL, n_prompts: int = 60) -> None:
    """A few lines: the search (auto grid, CAMA) on a planted zoo model recovers its planted
    (wait, transfer). ``name`` if it is installed, else the first planted model there is (a mask held by
    hooks says so); skipped with a note when there is none."""
    from circuits.groundtruth.recovery import model_folder, planted_models, planted_structure
    from circuits.models.loading import load_model
    from circuits.prompts import prepared
    from circuits.prompts.spec import PromptSpec
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
    from circuits import timing

    with timing.phase("load"):
        model = load_model(name)
    with timing.phase("prompts"):
        prompts = prepared.prepare(PromptSpec(spec.task, n_prompts), model, means="cama", out=None, progress=False)
    res = search_prepared(model, name, prompts, threshold=spec.threshold, grid="auto", out=None, progress=False,
                          meta={}, n_boot=200)
    got = res.selected.config if res.selected is not None else None
    print()
    print(f"planted check: {name} was trained with wait={s.wait}, transfer={s.transfer} (last position reads "
          f"through heads " + " ".join(f"L{b}H{h}" for b, h in sorted(s.head_set)) + f"; {how})")
    print(f"  search on {len(prompts)} {spec.task} prompts: {res.summary_line()}")
    print(f"  {'recovered' if got == (s.wait, s.transfer) else 'NOT recovered'}; all planted models: "
          f"`af1 groundtruth` (docs/groundtruth.md)")


def check(spec: DemoSpecs) -> None:
    """Checks before anything loads: the prompt count, the threshold and the task."""
    from circuits.commands.common import check_out, check_task
    from circuits.validation import check_fraction, check_positive

    check_positive("--n-prompts", spec.n_prompts)
    check_fraction("--threshold", spec.threshold)
    check_task(spec.task, spec.n_prompts)
    check_out(spec.out)
