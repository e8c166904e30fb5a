"""Training of the ground-truth zoo models: models whose AF1 structure (see :mod:`circuits.zoo.structure`)
is *learned* and holds in ordinary weights, with no hook at inference, and that must reach the zoo's bar
(>= 0.95 frozen-set accuracy on every Original task) to be shipped.

Schedule (one :class:`GroundTruthConfig` per model, in :data:`GROUND_TRUTHS`):

0. **ramp** (``ramp_steps`` > 0, for a start from an accurate model): forbidden scores are lowered by a
   bias growing linearly from 0 to ``ramp_bias`` (score units) over ``ramp_steps`` steps, and the penalty
   weight grows from 0 to ``pen_weight`` with it, so the model
   moves its computation into the structure gradually instead of losing it at once;
1. **hard mask** (from step ``ramp_steps``): forbidden attention scores are set to -inf in every forward
   pass, so the model learns the task under the exact structure; from step ``pen_start`` a hinge penalty
   on the *raw* forbidden scores (:class:`~circuits.zoo.structure.ScoreHooks`, margin ``margin`` in score
   units), its weight growing linearly to ``pen_weight`` over ``pen_ramp`` steps (with ``pen_when`` > 0, from
   the first evaluation where every task's masked held-out accuracy reached ``pen_when``), teaches the query/key
   weights to give those keys no attention on their own. (With the penalty from step 0 the designated
   heads, whose non-last rows must prefer BOS and themselves by the margin with the same weights, settled
   on BOS and self in the last row too and never learned to read: first the reading, then the margin.)
2. **penalty only**: at the first evaluation where the *unmasked* model gives no forbidden key more than
   ``mass_target`` of a row on the validation prompts, the mask is switched off for good and training
   continues with the penalty alone;
3. **stop** at the first evaluation (in phase 2) with every task's unmasked held-out accuracy >=
   ``stop_at`` and the unmasked forbidden mass < ``mass_target``, or after ``steps`` / ``max_wall_s``.

Head dropout: in every training forward pass, each *non-designated* head of the transfer blocks is
zeroed (its ``hook_z``, at every position) independently per prompt with probability ``head_dropout``,
so that the trained model does not depend on those heads at all: removing them, as head pruning does,
leaves the answer unchanged, and the designated heads are the only transfer heads it needs.

Objective: cross-entropy of the answer at the last position; every batch mixes all tasks and runs as
one forward pass per prompt length (:func:`circuits.zoo.data.layout_batches`), so no row is padded and
"last" is the last token. AdamW, warmup + cosine LR, gradient clipping and
safetensors checkpoints with resume come from :mod:`circuits.zoo.trainer`; data splits and frozen-set
accuracy from :mod:`circuits.zoo.data`; the model folder from :mod:`circuits.zoo.export` (plus
``"groundtruth"`` in ``zoo.json``, which attaches nothing at load time).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from circuits.atomic import write_text
from circuits.errors import ModelLoadError
from circuits.zoo import MODELS_DIR, trainer
from circuits.zoo.data import accuracy, build_splits, layout_batches
from circuits.zoo.recipes import ORIGINAL_TASKS, get_config
from circuits.zoo.structure import ScoreHooks, Structure, forbidden_mass

__all__ = ["GroundTruthConfig", "GROUND_TRUTHS", "PENALTY_PHASES", "STRONG_PENALTY_PHASES", "BASE_HINTS",
           "train_config", "penalty_weight", "head_dropout_hooks", "phase_list", "train", "run_phase", "measure"]


@dataclass(frozen=True)
class GroundTruthConfig:
    """Recipe of one ground-truth model: ``structure`` (as :meth:`Structure.to_dict`), ``base`` (zoo model
    whose weights it starts from; ``None``, the default: random init, number-feature initialised, with the
    architecture and tokenizer of ``arch_of``), overrides of the architecture (``n_layers``, ``d_mlp``) and
    the optimisation (see the module docstring; ``lr`` peak, ``warmup``/``steps`` in steps, ``margin`` and
    ``ramp_bias`` in attention-score units, ``mass_target`` a fraction of a row's attention,
    ``max_wall_s`` seconds). ``task_weights``: relative sampling weight per task (``None``: uniform).
    ``phases``: overrides of later phases (see :func:`phase_list`).

    A start from the accurate ``arith-gpt2`` (``base="arith-gpt2"``, with or without a ramp) was tried
    and dropped: that model reads other tokens from block 0 on, and even a bias of 4 on the forbidden
    scores (a ramp of 1500 steps, at step 200) took its held-out accuracy below 10%, so it kept no head
    start over a random init."""

    name: str
    structure: dict
    base: str | None = None
    arch_of: str = "arith-gpt2"
    n_layers: int | None = None
    d_mlp: int | None = None
    steps: int = 5500
    batch_size: int = 128
    lr: float = 1e-3
    warmup: int = 200
    min_lr_frac: float = 0.05
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 250
    eval_n: int = 200
    stop_at: float = 0.98
    margin: float = 10.0
    pen_weight: float = 0.1
    pen_start: int = 2500
    pen_ramp: int = 1000
    pen_when: float = 0.0
    mass_target: float = 5e-4
    head_dropout: float = 0.5
    ramp_steps: int = 0
    ramp_bias: float = 30.0
    max_wall_s: float = 4200.0
    threads: int = 1
    task_weights: dict | None = None
    phases: tuple = ()
    description: str = ""


def _gt(name: str, wait: int, transfer: int, heads: list[list[int]], windows: list[list[str]],
        **kw) -> GroundTruthConfig:
    s = Structure(wait, transfer, tuple(tuple(h) for h in heads), tuple(tuple(w) for w in windows))
    return GroundTruthConfig(name=name, structure=s.to_dict(), **kw)


PENALTY_PHASES: tuple[dict[str, Any], ...] = (
    {"lr": 2e-4, "warmup": 20, "steps": 6000, "pen_weight": 1.0, "pen_start": 0, "pen_ramp": 1, "pen_when": 0.0,
     "max_wall_s": 1800, "seed": 5},
    {"lr": 1e-4, "warmup": 20, "steps": 4000, "pen_weight": 5.0, "pen_start": 0, "pen_ramp": 1, "pen_when": 0.0,
     "max_wall_s": 1200, "seed": 7},
    {"lr": 5e-5, "warmup": 20, "steps": 4000, "pen_weight": 5.0, "pen_start": 0, "pen_ramp": 1, "pen_when": 0.0,
     "max_wall_s": 1200, "seed": 9, "task_weights": {"add_add": 3.0}})
"""Phases 2-4 of the w2t2 recipe (the schedule that brought it under the bar without the mask), reused after a
phase 1 that learned the task under the hard mask: the penalty at weight 1 from the start (LR 2e-4), then at 5
(LR 1e-4), then at 5 with ``add_add`` weighted 3 to 1 (LR 5e-5)."""

STRONG_PENALTY_PHASES = (PENALTY_PHASES[0],) + tuple({**ph, "pen_weight": 50.0} for ph in PENALTY_PHASES[1:])
""":data:`PENALTY_PHASES` with the penalty at 50 in phases 3-4: after a phase 1 without the penalty (the
new recipes), weight 5 left the forbidden attention of the last row at ~0.95 (it lowered the mean hinge
from 1.2 to 1.0 in 1000 steps); the rows of the other positions were clean already."""

GROUND_TRUTHS: dict[str, GroundTruthConfig] = {c.name: c for c in [
    # From the weights of the former mask-based arith-gpt2-af1 (the same wait 2, transfer 2, every head of
    # blocks 3-4 reading): the start that learned fastest under this structure. Phases 2-4 press the
    # forbidden mass down with a 10x and 50x penalty at lower LRs; phase 4 weighs add_add 3 to 1. (The
    # shipped weights ran phase 4 as 3000 steps and then resumed it, optimiser state kept, to 4000.)
    _gt("arith-gpt2-gt-w2t2", 2, 2, [[0, 1, 2, 3], [0, 1, 2, 3]], [["all"] * 4, ["all"] * 4], base="arith-gpt2-af1",
        lr=5e-4, warmup=100, steps=6000, pen_start=500, pen_ramp=1000, max_wall_s=2700, head_dropout=0.0,
        phases=tuple({**ph, "max_wall_s": wall} for ph, wall in zip(PENALTY_PHASES, (1800, 660, 1000)))),
    # From the shipped arith-gpt2-gt-w2t2 (its operand positions already read nothing but BOS and themselves):
    # the reads of block 3 move into two heads of block 4 with disjoint windows. Phase 1: hard mask from
    # step 0, no penalty (it never reached pen_when; a penalty from the start, or a soft ramp into the
    # mask, took the accuracy to ~0.05 for good: the designated heads settle on BOS and themselves).
    # Phases 2-3: those of w2t2 with the penalty at 50 instead of 5 in phase 3 (STRONG_PENALTY_PHASES), which
    # left one link: L4H1 ("first") giving 0.25-0.41 of the last row to the last operator and operand of
    # three-operand prompts (which keys are "first" depends on the prompt length, a relative-position rule
    # that learned positions pick up slowly); phases 4-6 press it with the penalty at 200 (after phase 5:
    # frozen-set accuracy 0.88-0.99, largest forbidden attention ~9e-4); phase 6 goes on at LR 3e-5 with
    # add_add weighted 3 to 1 (the shipped run: 6000 steps, add_add 0.913, then resumed, optimiser state
    # kept, to 9000: 0.887) and phase 7 at LR 1e-5 with add_add weighted 4 to 1 (0.963).
    _gt("arith-gpt2-gt-w3t1", 3, 1, [[1, 2]], [["first", "last"]], base="arith-gpt2-gt-w2t2", seed=2,
        lr=5e-4, warmup=50, steps=8000, pen_start=0, pen_when=0.9, pen_ramp=1000, pen_weight=1.0, max_wall_s=3000,
        phases=STRONG_PENALTY_PHASES[:2] + (
            {**STRONG_PENALTY_PHASES[1], "pen_weight": 200.0, "steps": 6000, "max_wall_s": 1800, "seed": 8},
            {**STRONG_PENALTY_PHASES[2], "pen_weight": 200.0, "seed": 10},
            {**STRONG_PENALTY_PHASES[2], "lr": 3e-5, "pen_weight": 200.0, "steps": 9000, "max_wall_s": 1800,
             "seed": 16, "task_weights": {"add_add": 3.0}},
            {**STRONG_PENALTY_PHASES[2], "lr": 1e-5, "warmup": 100, "pen_weight": 200.0, "max_wall_s": 1800,
             "seed": 18, "task_weights": {"add_add": 4.0}})),
    # Llama-like with grouped-query attention (4 query heads, 2 key/value heads), from a random init: the
    # first operand(s) read by L2H1 (key/value group 0), the last operator and operand by L3H2 (group 1).
    # Phases 2-4: STRONG_PENALTY_PHASES (after phase 4: held-out accuracy 0.95-1.00 without the mask, largest
    # forbidden attention 1.6e-3, still falling); phase 5 goes on at the same LR with the penalty at 100
    # (at 200 and LR 1e-4 the accuracy fell to 0.15-0.67 within 750 steps).
    _gt("arith-llama-gt-w1t2", 1, 2, [[1], [2]], [["first"], ["last"]], arch_of="arith-llama", seed=3,
        lr=1.5e-3, warmup=200, steps=6000, pen_start=2500, pen_ramp=1000, pen_weight=1.0, max_wall_s=3000,
        phases=STRONG_PENALTY_PHASES + ({**STRONG_PENALTY_PHASES[2], "pen_weight": 100.0, "seed": 11},)),
]}
"""The recipes of the shipped ground-truth models, by name."""


BASE_HINTS = {"arith-gpt2-af1": (
    "in a checkout, restore them with `git checkout 645c8c7 -- circuits/zoo/models/arith-gpt2-af1`, or retrain "
    "them with `python -m circuits.zoo.planted train` (TransformerLens 3.x; writes that folder)")}
"""How to obtain a recipe's starting weights that the package no longer ships, by zoo name."""


def train_config(cfg: GroundTruthConfig):
    """The :class:`~circuits.zoo.recipes.TrainConfig` recorded for (and used by) ``cfg``: the architecture
    and data of ``cfg.arch_of`` with ``cfg``'s optimisation (one phase)."""
    base = get_config(cfg.arch_of)
    arch: dict[str, Any] = {k: v for k, v in (("n_layers", cfg.n_layers), ("d_mlp", cfg.d_mlp)) if v is not None}
    s = Structure.from_dict(cfg.structure)
    desc = cfg.description or (
        f"{'Llama-like (grouped-query attention)' if base.arch == 'llama' else 'GPT-2-like'} ground truth "
        f"({'fine-tuned from ' + cfg.base if cfg.base else 'trained from scratch'}"
        f"{', no longer shipped' if cfg.base in BASE_HINTS else ''}) with "
        f"a learned AF1 structure: wait={s.wait}, transfer={s.transfer} (blocks {s.blocks}), the last position "
        f"reads other positions only through " + ", ".join(f"L{b}H{h} ({s.window(b, h)} window)" for b, h in
        sorted(s.head_set)) + "; every other head attends to BOS and itself; no hooks at inference.")
    return dataclasses.replace(
        base, name=cfg.name, tasks=list(ORIGINAL_TASKS), bars={t: 0.95 for t in ORIGINAL_TASKS}, steps=cfg.steps,
        batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup, min_lr_frac=cfg.min_lr_frac,
        weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, seed=cfg.seed, eval_every=cfg.eval_every,
        ckpt_every=cfg.eval_every, eval_n=cfg.eval_n, stop_at=cfg.stop_at, stop_after=1,
        max_wall_s=cfg.max_wall_s, init_from=cfg.base, phases=[], task_weights=cfg.task_weights, description=desc,
        **arch)


def _new(cfg: GroundTruthConfig, tcfg) -> Any:
    """The model training starts from: ``cfg.base`` (a zoo name or a model folder) without any attention
    hooks, or a fresh number-feature-initialised model of ``tcfg``."""
    from circuits import zoo
    from circuits.zoo.build import new_model
    from circuits.zoo.tokenizer import build_tokenizer

    if cfg.base:
        folder = Path(cfg.base) if Path(cfg.base).is_dir() else zoo.MODELS_DIR / cfg.base
        if not (folder / "model.safetensors").is_file():
            raise ModelLoadError(f"{cfg.name} starts from the weights of {cfg.base}, which are not shipped: "
                                 + BASE_HINTS.get(cfg.base, f"train them first with `af1 zoo train {cfg.base}`"))
        model = zoo.load_dir(folder)
        model.reset_hooks(including_permanent=True)  # a former planted folder attaches its mask
        return model
    return new_model(tcfg, build_tokenizer(), "hooked")


def penalty_weight(cfg: GroundTruthConfig, step: int, pen_from: int | None = None) -> float:
    """Weight of the score penalty at ``step``: 0 before its start, then growing linearly to ``pen_weight``
    over ``pen_ramp`` steps (times the ramp of ``ramp_steps``, if any). The start is ``pen_start``, or, with
    ``pen_when`` > 0, ``pen_from``: the step of the first evaluation (at or after ``pen_start``) where every
    task's held-out accuracy under the hard mask reached ``pen_when`` (``None``: not yet, weight 0)."""
    start = cfg.pen_start if cfg.pen_when <= 0 else pen_from
    if start is None:
        return 0.0
    w = cfg.pen_weight * min(1.0, max(0.0, (step - start) / max(1, cfg.pen_ramp)))
    return w * (min(1.0, step / cfg.ramp_steps) if cfg.ramp_steps > 0 else 1.0)


def head_dropout_hooks(structure: Structure, n_heads: int, p: float) -> list[tuple[str, Any]]:
    """``hook_z`` hooks that zero each non-designated head of the transfer blocks, independently per
    prompt, with probability ``p`` (training only)."""
    import torch

    def make(block: int):
        keep_heads = torch.tensor([h in structure.heads[block - structure.wait - 1] for h in range(n_heads)])

        def body(z, hook):
            drop = (torch.rand(z.shape[0], 1, n_heads, 1) < p) & ~keep_heads[None, None, :, None]
            return z.masked_fill(drop, 0.0)

        return body

    return [(f"blocks.{b}.attn.hook_z", make(b)) for b in structure.blocks] if p > 0 else []


def _evaluate(model, hooks: ScoreHooks, val_data, structure: Structure) -> dict:
    """Held-out accuracy per task with the mask (``masked``) and without (``plain``) and the unmasked
    forbidden mass (``max_key``) over every task's validation prompts."""
    import torch

    hard = hooks.hard
    hooks.hard = True
    with model.hooks(fwd_hooks=hooks.hooks()):
        masked = {d.name: accuracy(model, d) for d in val_data}
    hooks.hard = hard
    plain = {d.name: accuracy(model, d) for d in val_data}
    mass = max(forbidden_mass(model, structure, torch.from_numpy(d.tokens))["max_key"] for d in val_data)
    return {"masked": masked, "plain": plain, "max_key": mass}


def phase_list(cfg: GroundTruthConfig) -> list[GroundTruthConfig]:
    """The phases of ``cfg``: ``cfg`` itself, then ``cfg`` with each entry of ``cfg.phases`` applied (a later
    phase starts from the weights the phase before it ends with, with a fresh AdamW, LR schedule, mask
    state and penalty schedule)."""
    return [dataclasses.replace(cfg, phases=())] + [dataclasses.replace(cfg, phases=(), **ph) for ph in cfg.phases]


def train(cfg: GroundTruthConfig, out_dir: str | Path | None = None, ckpt_dir: str | Path | None = None,
          resume: bool = True, log=print) -> dict:
    """Train ``cfg`` (every phase, :func:`phase_list`) with the schedule of the module docstring and export
    it to ``out_dir`` (default the package's ``models/<name>``); phase ``k`` checkpoints in
    ``<ckpt_dir>/phase<k>`` (default ``ckpt_dir``: ``runs/zoo/<name>``), resumed with ``resume`` (a finished
    phase is loaded, not rerun). Returns the card dict."""
    import torch

    from circuits.zoo.build import require_hooked

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_hooked(f"training the ground-truth model {cfg.name} (hooks on the attention scores)")
    torch.set_num_threads(cfg.threads)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / cfg.name
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / cfg.name
    with trainer.held(out_dir, ckpt_dir):  # locked like every command's directory
        model = _new(cfg, train_config(cfg))
        states = [run_phase(model, pcfg, ckpt_dir / f"phase{k}", resume, log)
                  for k, pcfg in enumerate(phase_list(cfg), start=1)]
        model.eval()
        return export(model, cfg, train_config(cfg), out_dir, states)


def run_phase(model: Any, cfg: GroundTruthConfig, ckpt_dir: Path, resume: bool, log=print) -> dict:
    """Run one phase (a :class:`GroundTruthConfig` without ``phases``) on ``model`` in place, or load it
    from ``ckpt_dir`` when it finished before; returns its state (step, wall time, history, mask state)."""
    import torch
    import torch.nn.functional as F

    tcfg = train_config(cfg)
    structure = Structure.from_dict(cfg.structure)
    hooks = ScoreHooks(model, structure, margin=cfg.margin, hard=cfg.ramp_steps <= 0)
    opt = trainer.make_optimizer(model, tcfg)
    state = trainer.start(model, opt, tcfg, ckpt_dir, resume, len(model.tokenizer))
    if state.get("finished"):
        return state
    state.setdefault("hard", True)
    train_data, val_data = build_splits(tcfg, model.tokenizer)
    state.update(threads=torch.get_num_threads(), batch_size=tcfg.batch_size, lr=tcfg.lr, warmup=tcfg.warmup,
                 min_lr_frac=tcfg.min_lr_frac)
    dropout = head_dropout_hooks(structure, model.cfg.n_heads, cfg.head_dropout)
    torch.manual_seed(cfg.seed + state["step"])
    t0 = time.time() - state["wall_s"]
    step = state["step"]
    model.train()
    while step < tcfg.steps and not state.get("stopped_early"):
        for g in opt.param_groups:
            g["lr"] = trainer.lr_at(step, tcfg)
        groups = layout_batches(train_data, step, tcfg)
        hooks.hard = state["hard"] and step >= cfg.ramp_steps
        hooks.bias = cfg.ramp_bias * min(1.0, step / cfg.ramp_steps) if cfg.ramp_steps > 0 else 0.0
        hooks.reset()
        ce: Any = 0.0  # a tensor once the first group's loss is added
        with model.hooks(fwd_hooks=hooks.hooks() + dropout):
            for toks, ans in groups:
                logits = trainer.last_logits(model, torch.from_numpy(toks))
                ce = ce + F.cross_entropy(logits, torch.from_numpy(ans), reduction="sum") / tcfg.batch_size
        assert hooks.penalty is not None  # the score hooks ran in the passes above
        loss = ce + penalty_weight(cfg, step, state.get("pen_from")) * hooks.penalty / len(groups)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        opt.step()
        step += 1
        state["step"], state["wall_s"] = step, time.time() - t0
        if step % tcfg.eval_every == 0 or step == tcfg.steps:
            model.eval()
            ev = _evaluate(model, hooks, val_data, structure)
            model.train()
            state["history"].append({"step": step, "ce": round(ce.item(), 4), "penalty": round(hooks.penalty.item(), 5),
                                     "hard": hooks.hard, "val": ev["plain"], "val_masked": ev["masked"],
                                     "max_key": ev["max_key"], "wall_s": round(state["wall_s"], 1)})
            log(f"{cfg.name} step {step} {state['wall_s']:.0f}s hard={hooks.hard} bias={hooks.bias:.1f} "
                f"ce {ce.item():.4f} pen {hooks.penalty.item():.4f} mass {ev['max_key']:.2e} "
                f"min-val masked {min(ev['masked'].values()):.3f} "
                f"plain {min(ev['plain'].values()):.3f} " + " ".join(f"{k}={v:.3f}" for k, v in ev["plain"].items()))
            if (cfg.pen_when > 0 and state.get("pen_from") is None and step >= cfg.pen_start
                    and min(ev["masked"].values()) >= cfg.pen_when):
                state["pen_from"] = step
                log(f"{cfg.name}: every task >= {cfg.pen_when} under the mask: penalty from step {step}")
            if (hooks.hard and ev["max_key"] < cfg.mass_target
                    and penalty_weight(cfg, step, state.get("pen_from")) >= cfg.pen_weight):
                hooks.hard = state["hard"] = False
                state["mask_off_step"] = step
                log(f"{cfg.name}: unmasked forbidden mass {ev['max_key']:.2e} < {cfg.mass_target}: mask off")
            elif not state["hard"] and ev["max_key"] < cfg.mass_target and min(ev["plain"].values()) >= cfg.stop_at:
                state["stopped_early"] = True
                log(f"{cfg.name}: every task >= {cfg.stop_at} without the mask, stopping")
            trainer.save_checkpoint(model, opt, state, ckpt_dir)
        if state["wall_s"] >= cfg.max_wall_s:
            log(f"{cfg.name}: wall-time budget {cfg.max_wall_s:.0f} s spent, stopping at step {step}")
            break
    state["finished"] = True
    trainer.save_checkpoint(model, opt, state, ckpt_dir)
    model.eval()
    return state


def measure(model, structure: Structure, tasks: list[str] = ORIGINAL_TASKS) -> dict:
    """Forbidden attention on each task's frozen set in a plain forward pass (no hooks):
    ``{"max_key": ..., "max_row": ..., "per_task": {task: max_key}}`` (fractions of a row's attention)."""
    import numpy as np
    import torch

    from circuits import tasks as _tasks
    from circuits.zoo.data import TaskData

    per_task, rows = {}, []
    for name in tasks:
        ops = np.array(_tasks.frozen_set(name)["operands"], dtype=np.int64)
        m = forbidden_mass(model, structure, torch.from_numpy(TaskData(name, ops, model.tokenizer).tokens))
        per_task[name] = m["max_key"]
        rows.append(m["max_row"])
    return {"max_key": max(per_task.values()), "max_row": max(rows), "per_task": per_task}


def export(model, cfg: GroundTruthConfig, tcfg, out_dir: Path, states: list[dict]) -> dict:
    """Write the model folder (:func:`circuits.zoo.export.export`, ``zoo.json`` with ``"groundtruth"``) and
    add to its card the planted structure, the schedule and the forbidden mass on the frozen sets."""
    from circuits.zoo import export as zexport

    out_dir = Path(out_dir)
    structure = Structure.from_dict(cfg.structure)
    card = zexport.export(model, tcfg, out_dir, states, meta={"groundtruth": cfg.structure})
    mass = measure(model, structure)
    card["groundtruth"] = {**cfg.structure, "head_set": sorted(structure.head_set)}
    card["forbidden_mass"] = mass
    card["mask_off_step"] = [st.get("mask_off_step") for st in states]
    card["groundtruth_train"] = dataclasses.asdict(cfg)
    write_text(out_dir / "card.json", json.dumps(card, indent=1))
    heads = ", ".join(f"block {b}: heads {hs}" for b, hs in cfg.structure["heads"].items())
    md = (out_dir / "card.md").read_text()
    md += (f"\n## Planted AF1 structure (learned; ordinary weights, no hooks)\n\n"
           f"- wait = {structure.wait} (last waiting block, 0-indexed), transfer = {structure.transfer} "
           f"(blocks {structure.blocks});\n"
           f"- the last position reads other positions only through {heads}; every other head, and every "
           f"non-last position in every block, attends only to BOS and itself.\n"
           f"- Hard mask removed at step {[st.get('mask_off_step') for st in states]} of each phase (None: kept to "
           f"the end of that phase), then the penalty alone.\n"
           f"- Largest attention any forbidden key receives on the frozen sets (plain forward pass): "
           f"**{mass['max_key']:.2e}** (largest forbidden mass of a row: {mass['max_row']:.2e}); target < 1e-3.\n")
    write_text(out_dir / "card.md", md)
    return card
