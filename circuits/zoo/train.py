"""Training of the embedded zoo models (deterministic, resumable, CPU-friendly): ``train(name)`` runs
every phase of a model's recipe, in order, and writes the model folder.

The pieces live in their own modules: the recipes in :mod:`circuits.zoo.recipes`, the task data in
:mod:`circuits.zoo.data`, the model construction and initialisation in :mod:`circuits.zoo.build`, the
optimiser step, LR schedule and checkpoints in :mod:`circuits.zoo.trainer` and the model folder in
:mod:`circuits.zoo.export`. Their public names are re-exported here, where the documentation and
``af1 zoo`` have always found them.

Phase ``k`` (1-indexed) checkpoints to ``<ckpt_dir>/phase<k>``; ``train(..., resume=True)`` skips finished
phases and continues an interrupted one with the same LR schedule and data. ``arith-styles`` starts from
the weights of ``arith-llama``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from circuits.logs import get_logger
from circuits.zoo import MODELS_DIR
from circuits.zoo.build import (
    digit_features,
    init_from_folder,
    init_number_features,
    load_weights,
    new_model,
    number_features,
    require_hooked,
)
from circuits.zoo.data import (
    TaskData,
    accuracy,
    build_splits,
    evaluate_frozen,
    held_out_tuples,
    sample_batch,
    template_ids,
)
from circuits.zoo.export import export
from circuits.zoo.recipes import (
    ORIGINAL_TASKS,
    PHASE2_STEPS,
    REGISTRY,
    STYLE_TASKS,
    Phase,
    TrainConfig,
    get_config,
    phase_configs,
)
from circuits.zoo.tokenizer import WORDS, build_tokenizer
from circuits.zoo.trainer import lr_at, optimizer_step

log = get_logger("zoo")

__all__ = ["train", "run_phase", "MODELS_DIR",
           # re-exported from the modules above
           "ORIGINAL_TASKS", "STYLE_TASKS", "PHASE2_STEPS", "Phase", "TrainConfig", "REGISTRY", "get_config",
           "phase_configs", "TaskData", "accuracy", "build_splits", "evaluate_frozen", "held_out_tuples",
           "sample_batch", "template_ids", "new_model", "init_from_folder", "require_hooked", "number_features",
           "digit_features", "init_number_features", "load_weights", "lr_at", "optimizer_step", "export",
           "build_tokenizer"]


def train(name: str, out_dir: str | Path | None = None, resume: bool = True, steps: int | None = None,
          ckpt_dir: str | Path | None = None, threads: int | None = 2, progress: bool = True,
          export_model: bool = True, model_class: str | None = None, **overrides) -> dict:
    """Train zoo model ``name`` (every phase of its recipe, in order) and write it to ``out_dir``
    (default: the package's ``models/<name>``).

    Writes ``model.safetensors``, ``config.json``, ``tokenizer.json``, ``card.json`` and ``card.md``.
    Phase ``k`` (1-indexed) checkpoints to ``<ckpt_dir>/phase<k>`` (default ``ckpt_dir``:
    ``runs/zoo/<name>``); with ``resume`` a finished phase is loaded instead of rerun and an interrupted
    one continues from its checkpoint. ``steps`` and ``overrides`` (e.g. ``batch_size``, ``lr``,
    ``eval_every``, ``max_wall_s``: fields of :class:`TrainConfig`) replace those of the last phase.
    ``model_class`` (see :func:`circuits.zoo.build.new_model`): ``"hooked"`` (the default where
    TransformerLens 3.x is installed; reproduces the shipped models) or ``"transformers"`` (the Hugging
    Face model with plain PyTorch; the default on TransformerLens 4.x).
    Returns the card dict (or, with ``export_model=False``, the per-phase states).
    """
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = get_config(name)
    phases = phase_configs(cfg)
    if steps is not None:
        overrides["steps"] = int(steps)
    phases[-1] = dataclasses.replace(phases[-1], **overrides)
    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / name
    ckpt_root = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / name
    from circuits.zoo.trainer import check_out_folder, held

    if export_model:
        check_out_folder(out_dir, name)

    tokenizer = build_tokenizer(words=[*WORDS, *cfg.extra_tokens]) if cfg.extra_tokens else build_tokenizer()
    with held(*([out_dir] if export_model else []), ckpt_root):  # locked like every command's directory
        model = new_model(cfg, tokenizer, model_class)
        states = [run_phase(model, pcfg, ckpt_root / f"phase{pcfg.phase}", resume, progress) for pcfg in phases]
        model.eval()
        if not export_model:
            return {"phases": states}
        return export(model, cfg, out_dir, states)


def run_phase(model, cfg: TrainConfig, ckpt_dir: Path, resume: bool, progress: bool = True) -> dict:
    """Run (or load, if finished) one phase on ``model`` in place; returns the phase's state dict
    (step, wall_s, history, threads, d_vocab). Phase 1 of a recipe with ``init_from`` starts from the
    weights of that shipped model."""
    from circuits.zoo import trainer

    tokenizer = model.tokenizer

    def init() -> None:
        if cfg.init_from:
            src = MODELS_DIR / cfg.init_from
            if not (src / "model.safetensors").exists():
                raise FileNotFoundError(f"{cfg.name} starts from {cfg.init_from}, but {src}/model.safetensors does "
                                        f"not exist: train it first with `af1 zoo train {cfg.init_from}`")
            init_from_folder(model, src)
            log.info("%s: initialised from %s", cfg.name, src)

    opt = trainer.make_optimizer(model, cfg)
    state = trainer.start(model, opt, cfg, ckpt_dir, resume, len(tokenizer), init=init)
    if trainer.phase_done(state, cfg):
        log.info("%s: phase %s finished (%s steps), loaded from %s", cfg.name, cfg.phase, state["step"], ckpt_dir)
        return state
    if state["step"]:
        log.info("resuming %s phase %s from step %s", cfg.name, cfg.phase, state["step"])
    train_data, val_data = build_splits(cfg, tokenizer)
    return trainer.loop(model, opt, cfg, state,
                        batch=lambda step: sample_batch(train_data, step, cfg, tokenizer.pad_token_id),
                        evaluate=lambda: {d.name: accuracy(model, d) for d in val_data},
                        ckpt_dir=ckpt_dir, label=f"{cfg.name} phase {cfg.phase}", progress=progress)
