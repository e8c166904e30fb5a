"""``af1 zoo``: list, evaluate or retrain the embedded arithmetic models (the planted one included)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError
from circuits.validation import check_threads
from circuits.vocab import MODEL_CLASSES

if TYPE_CHECKING:
    from interventions.types import JsonDict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", metavar="ACTION")
    sub.add_parser("list", help="list the embedded models with their frozen-set accuracies")
    p = sub.add_parser("train", help="(re)train a model: every phase of its registered recipe, in order "
                                     "(arith-*-gt-*: the ground truths, see docs/groundtruth.md)")
    p.add_argument("name", help="model name, e.g. arith-gpt2 or arith-gpt2-gt-w2t2")
    p.add_argument("--out", default=None, help="output folder (default: the package's models/<name>)")
    p.add_argument("--ckpt", default=None, help="checkpoint folder (default: runs/zoo/<name>)")
    p.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints (rerun every phase)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--continue-from", metavar="FOLDER", default=None,
                   help="ground truths only: start from this model folder, trained with the recipe's first phases "
                        "(e.g. the shipped one before a phase was added), and run only the phases after them")
    p.add_argument("--model-class", choices=MODEL_CLASSES, default=None,
                   help="train a HookedTransformer (TransformerLens 3.x, reproduces the shipped models) or the "
                        "Hugging Face model with plain PyTorch (any TransformerLens); default: hooked where "
                        "TransformerLens 3.x is installed, else transformers")
    g = p.add_argument_group("overrides of the last phase's recipe (default: the registered value)")
    g.add_argument("--steps", type=int, default=None, help="number of steps (length of the cosine schedule)")
    g.add_argument("--batch-size", type=int, default=None, help="prompts per step")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate")
    g.add_argument("--eval-every", type=int, default=None, help="steps between held-out evaluations")
    g.add_argument("--max-wall-s", type=float, default=None, help="stop after this many seconds of training")
    p = sub.add_parser("eval", help="accuracy of a model on the frozen evaluation sets")
    p.add_argument("name", help="model name, e.g. arith-gpt2")
    p.add_argument("--tasks", nargs="*", default=None, help="tasks (default: those on the model's card)")
    p.add_argument("-n", type=int, default=None, help="use only the first N prompts of each frozen set")


def af1_check(model_dir: Path, task: str = "add_sub", n_build: int = 4000, threshold: float = 0.9) -> dict:
    """Deprecated: :func:`circuits.groundtruth.af1_check` (a ``DeprecationWarning`` says so)."""
    import warnings

    from circuits.groundtruth.recovery import af1_check as check

    warnings.warn("circuits.commands.zoo.af1_check is deprecated: use circuits.groundtruth.af1_check",
                  DeprecationWarning, stacklevel=2)
    return check(model_dir, task, n_build, threshold)


@dataclass(frozen=True)
class ZooSpecs:
    """What ``af1 zoo``'s command line names, read once (:func:`spec`): the ``action`` (``list``, ``train``,
    ``eval``), the model ``name`` and the action's options."""

    action: str
    name: str | None = None
    out: str | None = None
    ckpt: str | None = None
    resume: bool = True
    threads: int = 1
    continue_from: str | None = None
    model_class: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    tasks: tuple[str, ...] | None = None
    n: int | None = None


def spec(args: argparse.Namespace) -> ZooSpecs:
    action = getattr(args, "zoo_command", None) or "list"
    if action == "train":
        overrides = tuple((k, v) for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("lr", args.lr),
                                               ("eval_every", args.eval_every), ("max_wall_s", args.max_wall_s))
                          if v is not None)
        return ZooSpecs(action, name=args.name, out=args.out, ckpt=args.ckpt, resume=not args.no_resume,
                        threads=args.threads, continue_from=args.continue_from, model_class=args.model_class,
                        overrides=overrides)
    if action == "eval":
        return ZooSpecs(action, name=args.name, tasks=tuple(args.tasks) if args.tasks else None, n=args.n)
    return ZooSpecs(action)


def check(spec: ZooSpecs) -> None:
    """Checks before anything is loaded or trained."""
    if spec.action == "train":
        check_threads("--threads", spec.threads)
    if spec.action == "eval" and spec.n is not None and spec.n < 1:
        raise ArgumentError(f"-n {spec.n} is out of range: give an integer >= 1 (prompts per frozen set)")


LIST_COLUMNS = ("model", "arch", "tasks", "min acc", "description")
"""The columns of ``af1 zoo list``."""


def listing(cards: list[JsonDict]) -> str:
    """``af1 zoo list``: one row per model card (its ``name`` added), columns aligned under a header: the model, its
    architecture, the number of tasks it was trained on, the lowest frozen-set accuracy over them, its description."""
    rows = [LIST_COLUMNS]
    for c in cards:
        acc = c.get("frozen_accuracy", {})
        trained = c.get("train", {}).get("tasks", [])
        worst = min((acc[t] for t in trained if t in acc), default=float("nan"))
        rows.append((str(c["name"]), str(c.get("arch", "?")), str(len(trained)), f"{worst:.3f}",
                     str(c.get("description", ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(LIST_COLUMNS) - 1)]
    right = (False, False, True, True)  # numbers right-aligned
    return "\n".join("  ".join([*(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(row, widths, right)), row[-1]])
                     for row in rows)


def train_model(spec: ZooSpecs) -> JsonDict:
    """Run ``af1 zoo train``: a ground truth through :mod:`circuits.zoo.groundtruth` (the deprecated
    ``arith-gpt2-af1`` becomes its replacement, with a message), any other through
    :func:`circuits.zoo.train.train`; returns the card."""
    import dataclasses

    from circuits.zoo import ALIASES, groundtruth

    overrides = dict(spec.overrides)
    name = str(spec.name)
    if name in ALIASES:
        import sys

        print(f"DEPRECATED: {name} (a permanent attention mask) is replaced by {ALIASES[name]} (the same "
              f"planted wait=2, transfer=2, learned in the weights): training that", file=sys.stderr)
        name = ALIASES[name]
    if name in groundtruth.GROUND_TRUTHS:
        if spec.model_class == "transformers":
            raise ArgumentError(f"{name} trains with TransformerLens hooks on the attention scores, which needs a "
                                f"HookedTransformer: drop --model-class transformers (TransformerLens 3.x)")
        cfg = dataclasses.replace(groundtruth.GROUND_TRUTHS[name], threads=spec.threads, **overrides)
        return groundtruth.train(cfg, out_dir=spec.out, ckpt_dir=spec.ckpt, resume=spec.resume,
                                 continue_from=spec.continue_from)
    if spec.continue_from:
        raise ArgumentError(f"--continue-from continues a ground truth's recipe "
                            f"({', '.join(groundtruth.GROUND_TRUTHS)}); "
                            f"{name} trains in one run: drop --continue-from (checkpoints resume on their own)")
    from circuits.zoo.train import train

    return train(name, out_dir=spec.out, ckpt_dir=spec.ckpt, resume=spec.resume, threads=spec.threads,
                 model_class=spec.model_class, **overrides)


def run(spec: ZooSpecs) -> int:
    from circuits import zoo

    if spec.action == "list":
        names = zoo.available()
        if not names:
            print("no models shipped")
            return 0
        print(listing([zoo.card(name) | {"name": name} for name in names]))
        return 0
    if spec.action == "train":
        card = train_model(spec)
        for t, a in card["frozen_accuracy"].items():
            print(f"{t:18s} {a:.3f}")
        return 0 if all(card["meets_bar"].values()) else 1
    if spec.action == "eval":
        from circuits.zoo.data import evaluate_frozen

        name = str(spec.name)
        model = zoo.load(name)
        c = zoo.card(name)
        names = list(spec.tasks) if spec.tasks else list(c.get("frozen_accuracy") or c["train"]["tasks"])
        bars = c.get("bars", {})
        ok = True
        for t, a in evaluate_frozen(model, names, n=spec.n).items():
            bar = bars.get(t)
            ok &= bar is None or a >= bar
            print(f"{t:18s} {a:.3f}" + (f"  (bar {bar})" if bar is not None else ""))
        return 0 if ok else 1
    raise ArgumentError(f"unknown zoo action {spec.action!r}; known: list, train, eval")
