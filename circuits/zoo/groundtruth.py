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
   With ``keep_best`` the phase ends with the weights of its best evaluation instead of its last: the highest
   lowest-task held-out accuracy without the mask among the evaluations with the mask off and the forbidden mass
   under ``mass_target`` (ties: the later one; none: the last weights). For a phase that starts from an
   accurate model, where single evaluations swing by 0.1 and more.

A phase with ``readout`` > 0 runs none of this: it refits the unembedding alone to the answers
(:func:`readout_phase`), so attention, and with it the structure, is left exactly as it was.

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
from pathlib import Path
from typing import Any

from circuits.errors import ModelLoadError
from circuits.store.atomic import write_text
from circuits.zoo import MODELS_DIR, trainer
from circuits.zoo.data import accuracy, build_splits, layout_batches
from circuits.zoo.gt_recipes import (
    BASE_HINTS,
    GROUND_TRUTHS,
    MARGIN_PHASES,
    PENALTY_PHASES,
    STRONG_PENALTY_PHASES,
    GroundTruthConfig,
    phase_list,
    train_config,
)
from circuits.zoo.recipes import ORIGINAL_TASKS
from circuits.zoo.structure import ScoreHooks, Structure, forbidden_mass
from interventions.types import Model

__all__ = ["GroundTruthConfig", "GROUND_TRUTHS", "MARGIN_PHASES", "PENALTY_PHASES", "STRONG_PENALTY_PHASES",
           "BASE_HINTS", "BEST_FILE", "train_config", "penalty_weight", "head_dropout_hooks", "phase_list", "train",
           "continued", "run_phase", "readout_phase", "measure"]


def _new(cfg: GroundTruthConfig, tcfg) -> Model:
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


def train(cfg: GroundTruthConfig, out_dir: str | Path | None = None, ckpt_dir: str | Path | None = None,
          resume: bool = True, log=print, continue_from: str | Path | None = None) -> dict:
    """Train ``cfg`` (every phase, :func:`phase_list`) with the schedule of the module docstring and export
    it to ``out_dir`` (default the package's ``models/<name>``); phase ``k`` checkpoints in
    ``<ckpt_dir>/phase<k>`` (default ``ckpt_dir``: ``runs/zoo/<name>``), resumed with ``resume`` (a finished
    phase is loaded, not rerun). ``continue_from``: a model folder of ``cfg`` trained with its first ``k``
    phases (its card's recipe is ``cfg``'s with those phases; see :func:`continued`): its weights stand for the
    end of phase ``k`` and only the later phases run. Returns the card dict."""
    import torch

    from circuits.zoo.build import require_hooked

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_hooked(f"training the ground-truth model {cfg.name} (hooks on the attention scores)")
    torch.set_num_threads(cfg.threads)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / cfg.name
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / cfg.name
    trainer.check_out_folder(out_dir, cfg.name, Path(continue_from) if continue_from else None)
    with trainer.held(out_dir, ckpt_dir):  # locked like every command's directory
        model, states = continued(cfg, Path(continue_from)) if continue_from else (_new(cfg, train_config(cfg)), [])
        states += [run_phase(model, pcfg, ckpt_dir / f"phase{k}", resume, log)
                   for k, pcfg in enumerate(phase_list(cfg), start=1) if k > len(states)]
        model.eval()
        return export(model, cfg, train_config(cfg), out_dir, states)


def continued(cfg: GroundTruthConfig, folder: Path) -> tuple[Any, list[dict]]:
    """``(model, states)`` to continue ``cfg`` from the model folder ``folder``: its weights (as exported: the
    unembedding refitted without a bias, logits within 1e-4 of the phase's end) and one state per phase its
    card records (steps, wall time, LR schedule, mask-off step; no history but the last five evaluations). Its
    card must record ``cfg``'s structure and the first ``k`` of ``cfg``'s phases, ``k`` < the number of phases
    of ``cfg``; anything else is refused in one line (:class:`~circuits.errors.ArgumentError`)."""
    from circuits import zoo
    from circuits.errors import ArgumentError

    card_file = folder / "card.json"
    try:
        card = json.loads(card_file.read_text())
        recorded = card["groundtruth_train"]
        done = card["phases"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArgumentError(f"cannot continue {cfg.name} from {folder}: {card_file} is no ground-truth card "
                            f"({type(exc).__name__}: {exc}); give the folder of a model trained by this "
                            f"recipe") from None
    wanted = json.loads(json.dumps(dataclasses.asdict(cfg)))
    k = len(done)
    if (recorded.get("structure") != wanted["structure"] or not 1 <= k < 1 + len(cfg.phases)
            or recorded.get("phases") != wanted["phases"][:k - 1]):
        raise ArgumentError(f"cannot continue {cfg.name} from {folder}: its card records {k} phase(s) of another "
                            f"recipe or all {1 + len(cfg.phases)} of this one; continue from a folder trained with "
                            f"the first phases of {cfg.name}'s recipe")
    model = zoo.load_dir(folder)
    model.reset_hooks(including_permanent=True)
    keys = ("batch_size", "lr", "warmup", "min_lr_frac", "threads", "d_vocab")
    states = [{"step": ph["steps"], "wall_s": ph["wall_time_s"], **{key: ph.get(key) for key in keys},
               "history": card.get("history", []) if i == k - 1 else [], "finished": True,
               "mask_off_step": (card.get("mask_off_step") or [None] * k)[i],
               "note": ph.get("note") or f"recorded on the card of {folder.name} (the weights continued from)"}
              for i, ph in enumerate(done)]
    return model, states


def run_phase(model: Model, cfg: GroundTruthConfig, ckpt_dir: Path, resume: bool, log=print) -> dict:
    """Run one phase (a :class:`GroundTruthConfig` without ``phases``) on ``model`` in place, or load it
    from ``ckpt_dir`` when it finished before; returns its state (step, wall time, history, mask state)."""
    import torch
    import torch.nn.functional as F

    if cfg.readout:
        return readout_phase(model, cfg, ckpt_dir, resume, log)
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
        groups = layout_batches(train_data, step, tcfg, cfg.answer_balance)
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
            if cfg.keep_best and not state["hard"] and ev["max_key"] < cfg.mass_target:
                _keep_if_best(model, state, min(ev["plain"].values()), ckpt_dir, log)
            trainer.save_checkpoint(model, opt, state, ckpt_dir)
        if state["wall_s"] >= cfg.max_wall_s:
            log(f"{cfg.name}: wall-time budget {cfg.max_wall_s:.0f} s spent, stopping at step {step}")
            break
    if state.get("best"):
        from safetensors.torch import load_file

        from circuits.zoo.build import load_weights

        load_weights(model, load_file(str(ckpt_dir / BEST_FILE)), f"{ckpt_dir} best weights")
        state["note"] = (f"weights of step {state['best']['step']} (lowest task's held-out accuracy "
                         f"{state['best']['min_val']:.3f}), the best evaluation of {state['step']} steps")
    state["finished"] = True
    trainer.save_checkpoint(model, opt, state, ckpt_dir)
    model.eval()
    return state


def readout_phase(model: Model, cfg: GroundTruthConfig, ckpt_dir: Path, resume: bool, log=print) -> dict:
    """A phase with ``cfg.readout`` > 0: the unembedding ``W_U`` alone refitted to the answers of ``cfg.readout``
    training prompts per task (:func:`circuits.zoo.refit.fit_answers`, with the phase's ``answer_balance``,
    ``task_weights`` and ``seed``); no optimiser step, no mask, no penalty: attention, and so the structure,
    is exactly as the phase before left it. For a model whose last blocks carry the answer but whose readout is
    tuned to the common sums (w3t1: the sums >= 200 of ``add_add``). Checkpointed and resumed like a phase."""
    import torch

    from circuits.zoo.refit import fit_answers

    tcfg = train_config(cfg)
    opt = trainer.make_optimizer(model, tcfg)  # never steps: the checkpoint format holds one
    state = trainer.start(model, opt, tcfg, ckpt_dir, resume, len(model.tokenizer))
    if state.get("finished"):
        return state
    t0 = time.time()
    train_data, val_data = build_splits(tcfg, model.tokenizer)
    model.eval()
    before = {d.name: accuracy(model, d) for d in val_data}
    fit = fit_answers(model, train_data, cfg.readout, cfg.answer_balance, cfg.task_weights, cfg.seed)
    after = {d.name: accuracy(model, d) for d in val_data}
    wall = time.time() - t0
    state.update(threads=torch.get_num_threads(), wall_s=wall, finished=True, readout=fit,
                 history=[{"step": 0, "val": after, "val_before": before, "wall_s": round(wall, 1)}],
                 note=(f"unembedding refitted to the answers of {fit['n']} training prompts "
                       f"({fit['lbfgs_evaluations']} L-BFGS evaluations, cross-entropy {fit['ce_before']:.4f} -> "
                       f"{fit['ce_after']:.4f}); held-out lowest task {min(before.values()):.3f} -> "
                       f"{min(after.values()):.3f}; no other weight changed"))
    log(f"{cfg.name} readout: " + state["note"])
    trainer.save_checkpoint(model, opt, state, ckpt_dir)
    return state


BEST_FILE = "best.safetensors"
"""The weights of a ``keep_best`` phase's best evaluation so far, beside its checkpoint."""


def _keep_if_best(model, state: dict, score: float, ckpt_dir: Path, log=print) -> None:
    """Save ``model``'s weights as the phase's best (:data:`BEST_FILE`) when ``score`` (the lowest task's
    held-out accuracy) is at least the best so far; ``state["best"]`` records its step and score."""
    from safetensors.torch import save_file

    from circuits.store.atomic import write_with

    if state.get("best") and score < state["best"]["min_val"]:
        return
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    write_with(ckpt_dir / BEST_FILE, lambda tmp: save_file(weights, str(tmp), metadata={"step": str(state["step"])}))
    state["best"] = {"step": state["step"], "min_val": score}
    log(f"{ckpt_dir.name}: best so far at step {state['step']} (lowest task {score:.3f})")


def measure(model, structure: Structure, tasks: list[str] = ORIGINAL_TASKS) -> dict:
    """Forbidden attention on each task's frozen set in a plain forward pass (no hooks):
    ``{"max_key": ..., "max_row": ..., "per_task": {task: max_key}}`` (fractions of a row's attention)."""
    import numpy as np
    import torch

    from circuits.tasks import catalogue as _tasks
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
