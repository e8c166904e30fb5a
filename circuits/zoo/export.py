"""Writing a trained zoo model as a model folder: weights, config, tokenizer and model card."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from circuits import tasks as _tasks
from circuits.zoo.build import require_hooked
from circuits.zoo.data import evaluate_frozen
from circuits.zoo.recipes import STYLE_TASKS
from circuits.zoo.tokenizer import save_tokenizer

__all__ = ["export", "build_card", "card_markdown"]


def export(model, cfg, out_dir: Path, states: list[dict]) -> dict:
    """Write weights, config, tokenizer and card of a trained model to ``out_dir``; ``cfg`` is its
    :class:`~circuits.zoo.recipes.TrainConfig`, ``states`` holds one state dict per phase (as
    :func:`circuits.zoo.train.train` keeps them). Returns the card."""
    from safetensors.torch import save_file

    require_hooked("exporting a zoo model", model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in model.state_dict().items()
               if not k.endswith(("IGNORE", "mask"))}, str(out_dir / "model.safetensors"))
    mcfg = cfg.model_config(len(model.tokenizer))
    (out_dir / "config.json").write_text(json.dumps(mcfg, indent=1))
    save_tokenizer(model.tokenizer, out_dir / "tokenizer.json")
    card = build_card(model, cfg, mcfg, states)
    (out_dir / "card.json").write_text(json.dumps(card, indent=1))
    (out_dir / "card.md").write_text(card_markdown(card, cfg))
    return card


def build_card(model, cfg, mcfg: dict, states: list[dict]) -> dict:
    """The card of a trained model: architecture, recipe, per-phase steps and wall time, and accuracy on
    the frozen sets of its tasks and of the early-decoding tasks (measured now, on ``model``)."""
    eval_tasks = list(cfg.tasks) + [t for t in _tasks.list_tasks()
                                    if _tasks.get_task(t).group == "early_decoding" and t not in cfg.tasks]
    frozen = evaluate_frozen(model, eval_tasks)
    return {
        "name": cfg.name, "description": cfg.description, "arch": cfg.arch, "config": mcfg,
        "n_params": int(sum(p.numel() for p in model.parameters())),
        "train": {k: v for k, v in asdict(cfg).items() if k not in ("bars",)},
        "bars": cfg.bars, "steps_run": sum(st["step"] for st in states),
        "wall_time_s": round(sum(st["wall_s"] for st in states), 1),
        "threads": states[-1].get("threads"), "seed": cfg.seed,
        "phases": [{"phase": k, "steps": st["step"], "batch_size": st.get("batch_size"), "lr": st.get("lr"),
                    "warmup": st.get("warmup"), "min_lr_frac": st.get("min_lr_frac"),
                    "wall_time_s": round(st["wall_s"], 1), "threads": st.get("threads"),
                    "d_vocab": st.get("d_vocab"), **({"note": st["note"]} if st.get("note") else {})}
                   for k, st in enumerate(states, start=1)],
        "init": (f"weights of {cfg.init_from}" if cfg.init_from else
                 f"random, number-token embedding/unembedding started from {cfg.number_features} features"),
        "data": "all valid operand tuples of the training tasks (operands 0..99, answers >= 0), minus every "
                "frozen-set tuple with the same expression and a hashed 5% validation split",
        "frozen_accuracy": {k: round(v, 4) for k, v in frozen.items()},
        "meets_bar": {t: frozen[t] >= cfg.bars.get(t, 0.0) for t in cfg.tasks},
        "skipped_styles": ([t for t in STYLE_TASKS if t not in cfg.tasks]
                           if any(t in STYLE_TASKS for t in cfg.tasks) else []),
        "history": states[-1]["history"][-5:],
    }


def card_markdown(card: dict, cfg: Any) -> str:
    """``card.md``: the phases and the frozen-set accuracies of ``card`` as Markdown tables."""
    lines = [f"# {cfg.name}", "", cfg.description, "",
             f"Trained {card['steps_run']} steps in {card['wall_time_s'] / 60:.1f} min on a shared 2-core "
             f"machine (seed {cfg.seed}), in {len(card['phases'])} phase(s):", "",
             "| phase | steps | batch | peak LR | warmup | wall time | threads | vocab |",
             "|---|---|---|---|---|---|---|---|"]
    for ph in card["phases"]:
        lines.append(f"| {ph['phase']} | {ph['steps']} | {ph['batch_size']} | {ph['lr']} | {ph['warmup']} | "
                     f"{ph['wall_time_s'] / 60:.1f} min | {ph['threads']} | {ph['d_vocab']} |")
    lines += [f"\nPhase {ph['phase']}: {ph['note']}" for ph in card["phases"] if ph.get("note")]
    lines += ["", "| task | frozen-set accuracy | bar |", "|---|---|---|"]
    for t, a in card["frozen_accuracy"].items():
        lines.append(f"| {t} | {a:.3f} | {cfg.bars.get(t, '-')} |")
    return "\n".join(lines) + "\n"
