"""Writing a trained zoo model as a model folder (a Hugging Face checkpoint, see :mod:`circuits.zoo.hf`)
with its model card, and converting a folder of the former TransformerLens format. A
``HookedTransformer`` is written after its unembedding is refitted without a bias (the last step of every
recipe, :mod:`circuits.zoo.refit`), which the card records."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from circuits.errors import ArgumentError
from circuits.store.atomic import write_text
from circuits.tasks import catalogue as _tasks
from circuits.zoo import hf as _hf
from circuits.zoo.data import FRESH_N, FRESH_SEEDS, evaluate_fresh, evaluate_frozen
from circuits.zoo.recipes import STYLE_TASKS

__all__ = ["export", "build_card", "card_markdown", "refit_markdown", "convert_folder"]


def _hooked_state(model) -> tuple[dict, dict]:
    """``(config dict, state dict)`` of a ``HookedTransformer``; ``RuntimeError`` for anything else."""
    from interventions.adapter import resolve_backend

    if resolve_backend(None) == "hooked":
        from transformer_lens import HookedTransformer

        if isinstance(model, HookedTransformer):
            return model.cfg.to_dict(), {k: v for k, v in model.state_dict().items()
                                         if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))}
    raise RuntimeError(f"exporting a zoo model needs a HookedTransformer (TransformerLens 3.x) or the Hugging "
                       f"Face model being trained, got {type(model).__name__}: export the model you trained, "
                       f"not a TransformerBridge around it")


def export(model, cfg, out_dir: Path, states: list[dict], meta: dict | None = None) -> dict:
    """Write a trained model to ``out_dir`` as a Hugging Face checkpoint (:func:`circuits.zoo.hf.save_hf`)
    with its card; ``model`` is a ``HookedTransformer`` (its unembedding refitted without a bias in place,
    :func:`circuits.zoo.refit.refit_unembed`, then converted with :func:`circuits.zoo.hf.hf_from_hooked`)
    or a Hugging Face causal LM with ``model.tokenizer`` set (no bias to remove), ``cfg`` its
    :class:`~circuits.zoo.recipes.TrainConfig`, ``states`` one state dict per phase (as
    :func:`circuits.zoo.train.train` keeps them), ``meta`` the ``zoo.json`` entries. Returns the card."""
    import time

    from circuits.zoo.refit import refit_unembed

    tokenizer = model.tokenizer
    refit = None
    if _hf.is_hf(model):
        hf_model = model
    else:
        _hooked_state(model)  # a HookedTransformer, or a one-line refusal before anything changes
        t0 = time.time()
        refit = refit_unembed(model, cfg)
        refit["wall_time_s"] = round(time.time() - t0, 1)
        cfg_dict, state = _hooked_state(model)
        hf_model, b_U = _hf.hf_from_hooked(cfg_dict, state, tokenizer)
        assert b_U is None, "the refit leaves no unembedding bias"
    out_dir = Path(out_dir)
    _hf.save_hf(out_dir, hf_model, tokenizer, meta)
    mcfg = cfg.model_config(len(tokenizer))
    card = build_card(model, cfg, mcfg, states)
    if refit is not None:
        card["unembed_refit"] = refit
    write_text(out_dir / "card.json", json.dumps(card, indent=1))
    write_text(out_dir / "card.md", card_markdown(card, cfg))
    return card


def build_card(model, cfg, mcfg: dict, states: list[dict]) -> dict:
    """The card of a trained model: architecture, recipe, per-phase steps and wall time, and accuracy on
    the frozen sets of its tasks and of the early-decoding tasks (measured now, on ``model``)."""
    eval_tasks = list(cfg.tasks) + [t for t in _tasks.list_tasks()
                                    if _tasks.get_task(t).group == "early_decoding" and t not in cfg.tasks]
    frozen = evaluate_frozen(model, eval_tasks)
    fresh = evaluate_fresh(model, list(cfg.tasks))
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
        "fresh_accuracy": {"seeds": list(FRESH_SEEDS), "n": FRESH_N,
                           "accuracy": {t: [round(a, 4) for a in accs] for t, accs in fresh.items()}},
        "meets_bar_fresh": {t: min(accs) >= cfg.bars.get(t, 0.0) for t, accs in fresh.items()},
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
        cells = [ph["steps"]] + ["-" if ph.get(k) is None else ph[k] for k in ("batch_size", "lr", "warmup")]
        lines.append(f"| {ph['phase']} | " + " | ".join(map(str, cells)) + f" | {ph['wall_time_s'] / 60:.1f} min | "
                     f"{ph['threads']} | {ph['d_vocab']} |")
    lines += [f"\nPhase {ph['phase']}: {ph['note']}" for ph in card["phases"] if ph.get("note")]
    if card.get("unembed_refit"):
        lines += ["", refit_markdown(card["unembed_refit"])]
    fresh = card.get("fresh_accuracy", {})
    seeds = "/".join(str(s) for s in fresh.get("seeds", []))
    lines += ["", f"| task | frozen-set accuracy | fresh draws (seeds {seeds}) | bar |", "|---|---|---|---|"]
    for t, a in card["frozen_accuracy"].items():
        draws = fresh.get("accuracy", {}).get(t)
        lines.append(f"| {t} | {a:.3f} | {' / '.join(f'{x:.3f}' for x in draws) if draws else '-'} | "
                     f"{cfg.bars.get(t, '-')} |")
    if fresh:
        lines += ["", f"Fresh draws: {fresh['n']} prompts per task and seed from the task's operand space without "
                      f"its frozen set (`circuits.zoo.data.fresh_operands`, as `tasks.build_task(task, "
                      f"{fresh['n']}, seed, exclude=frozen)`); they may include training prompts."]
    return "\n".join(lines) + "\n"


def refit_markdown(refit: dict) -> str:
    """The card's paragraph on the last step of the recipe, the unembedding refitted without a bias."""
    if refit.get("method") == "none":
        return ("Last step: none needed (the model had no unembedding bias: trained without one, or continued from "
                "a folder whose bias was removed already, with the bias kept at zero since).")
    fit, val = refit["fit"], refit["val"]
    how = ("folded exactly: after the final LayerNorm the logits change by at most "
           f"{fit['max_logit_change']:.1e} (float32 rounding)" if refit["method"] == "fold" else
           "distilled: the mean KL divergence from the biased model"
           + (f" plus {refit['ce_weight']} x the answer's cross-entropy" if refit["ce_weight"] else "")
           + f", minimised over W_U alone with L-BFGS ({refit['lbfgs_evaluations']} evaluations)")
    return (f"Last step ({refit.get('wall_time_s', '?')} s): the unembedding bias b_U the HookedTransformer was "
            f"trained with is removed and W_U refitted (every other weight as trained) on {fit['n']} training "
            f"prompts ({refit['per_task']} per task, seed {refit['seed']}), {how}. On the validation split "
            f"({val['n']} prompts): "
            f"mean KL {val['kl_mean']:.1e} (largest {val['kl_max']:.1e}), argmax unchanged on "
            f"{val['argmax_same']:.4f} of the prompts, accuracy {val['accuracy_before']:.4f} -> "
            f"{val['accuracy_after']:.4f}. The folder is a plain Hugging Face checkpoint: `transformers` gives the "
            f"zoo's logits.")


def convert_folder(folder: str | Path, prompts: tuple[str, ...] = ("42+20-15=", "120+31-5=", "7+8+9=", "99-98-1="),
                   atol: float = 1e-4, hf_atol: float = 1e-4, tasks: tuple[str, ...] | None = None) -> dict:
    """Convert a model folder of the former TransformerLens format (``config.json`` = keyword arguments of
    ``HookedTransformerConfig``, ``model.safetensors`` in TransformerLens names, an optional ``"planted"``
    entry in the config) into the Hugging Face format of :mod:`circuits.zoo.hf`, in place.

    A nonzero unembedding bias is first refitted away (:func:`circuits.zoo.refit.refit_unembed`, on the
    training prompts of ``tasks``, default the six Original tasks). The folder is rewritten only if, on
    ``prompts`` (without the planted mask), the ``HookedTransformer`` rebuilt from the converted checkpoint
    (as ``zoo.load`` builds it) gives the logits of the refitted original to ``atol``, and plain
    ``transformers`` gives them to ``hf_atol`` (other kernels, so float32 rounding differs); otherwise
    ``RuntimeError``. Needs TransformerLens 3.x. Returns the largest logit differences,
    ``{"hooked": ..., "transformers": ..., "refit": <the refit's report>}``."""
    import dataclasses

    import torch
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuits.zoo.recipes import ORIGINAL_TASKS, get_config
    from circuits.zoo.refit import refit_unembed
    from circuits.zoo.tokenizer import load_tokenizer

    folder = Path(folder)
    cfg_kwargs = json.loads((folder / "config.json").read_text())
    if "architectures" in cfg_kwargs:
        raise ArgumentError(f"{folder} already is a Hugging Face checkpoint; nothing to convert")
    planted = cfg_kwargs.pop("planted", None)
    tokenizer = load_tokenizer(folder / "tokenizer.json")

    def hooked(cfg: Any, state: dict) -> Any:
        model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_state_dict(state, strict=False)
        return model.eval()

    old = hooked(HookedTransformerConfig(**cfg_kwargs), load_file(str(folder / _hf.WEIGHTS)))
    recipe = dataclasses.replace(get_config("arith-gpt2"), tasks=list(tasks or ORIGINAL_TASKS))
    refit = refit_unembed(old, recipe)
    cfg_dict, state = _hooked_state(old)
    hf_model, _ = _hf.hf_from_hooked(cfg_dict, state, tokenizer)
    new_cfg = HookedTransformerConfig(**_hf.hooked_config(hf_model.config))
    rebuilt = hooked(new_cfg, _hf.hooked_state(hf_model, new_cfg))
    worst: dict = {"hooked": 0.0, "transformers": 0.0}
    with torch.no_grad():
        for prompt in prompts:
            tokens = old.to_tokens(prompt)
            ref = old(tokens)
            worst["hooked"] = max(worst["hooked"], float((rebuilt(tokens) - ref).abs().max()))
            hf_gap = float((hf_model(input_ids=tokens).logits - ref).abs().max())
            worst["transformers"] = max(worst["transformers"], hf_gap)
    if worst["hooked"] > atol or worst["transformers"] > hf_atol:
        raise RuntimeError(f"{folder}: converted logits differ by {worst} (limits {atol:.0e} / {hf_atol:.0e}); "
                           f"folder left as it was")
    _hf.save_hf(folder, hf_model, tokenizer, {"planted": planted} if planted is not None else None)
    return {**worst, "refit": refit}
