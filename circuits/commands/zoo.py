"""``af1 zoo``: list, evaluate or retrain the embedded arithmetic models."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="zoo_command", metavar="ACTION")
    sub.add_parser("list", help="list the embedded models with their frozen-set accuracies")
    p = sub.add_parser("train", help="(re)train a model: every phase of its registered recipe, in order")
    p.add_argument("name", help="model name, e.g. arith-gpt2")
    p.add_argument("--out", default=None, help="output folder (default: the package's models/<name>)")
    p.add_argument("--steps", type=int, default=None, help="override the number of steps of the last phase")
    p.add_argument("--no-resume", action="store_true", help="ignore existing checkpoints (rerun every phase)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p = sub.add_parser("eval", help="accuracy of a model on the frozen evaluation sets")
    p.add_argument("name", help="model name, e.g. arith-gpt2")
    p.add_argument("--tasks", nargs="*", default=None, help="tasks (default: those on the model's card)")
    p.add_argument("-n", type=int, default=None, help="use only the first N prompts of each frozen set")


def run(args: argparse.Namespace) -> int:
    from circuits import zoo

    action = getattr(args, "zoo_command", None)
    if action in (None, "list"):
        names = zoo.available()
        if not names:
            print("no models shipped")
        for name in names:
            c = zoo.card(name)
            acc = c.get("frozen_accuracy", {})
            trained = c.get("train", {}).get("tasks", [])
            worst = min((acc[t] for t in trained if t in acc), default=float("nan"))
            print(f"{name:14s} {c.get('arch', '?'):6s} {len(trained):2d} tasks  min acc {worst:.3f}  "
                  f"{c.get('description', '')}")
        return 0
    if action == "train":
        from circuits.zoo.train import train

        card = train(args.name, out_dir=args.out, resume=not args.no_resume, steps=args.steps,
                     threads=args.threads)
        for t, a in card["frozen_accuracy"].items():
            print(f"{t:18s} {a:.3f}")
        return 0 if all(card["meets_bar"].values()) else 1
    if action == "eval":
        from circuits.zoo.train import evaluate_frozen

        model = zoo.load(args.name)
        c = zoo.card(args.name)
        names = args.tasks or list(c.get("frozen_accuracy") or c["train"]["tasks"])
        bars = c.get("bars", {})
        ok = True
        for t, a in evaluate_frozen(model, names, n=args.n).items():
            bar = bars.get(t)
            ok &= bar is None or a >= bar
            print(f"{t:18s} {a:.3f}" + (f"  (bar {bar})" if bar is not None else ""))
        return 0 if ok else 1
    raise ValueError(f"unknown zoo action {action!r}; known: list, train, eval")
