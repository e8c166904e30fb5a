"""The recipes of the ground-truth zoo models (:mod:`circuits.zoo.groundtruth` trains them): one
:class:`GroundTruthConfig` per model in :data:`GROUND_TRUTHS`, its phases (:func:`phase_list`) and the
:class:`~circuits.zoo.recipes.TrainConfig` each phase records (:func:`train_config`). The schedule the fields
steer (hard mask, penalty, mask off, stop, best evaluation) is described in :mod:`circuits.zoo.groundtruth`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuits.zoo.recipes import ORIGINAL_TASKS, get_config
from circuits.zoo.structure import Structure

if TYPE_CHECKING:
    from interventions.types import JsonDict  # torch is imported only where a model is

__all__ = ["GroundTruthConfig", "GROUND_TRUTHS", "MARGIN_PHASES", "PENALTY_PHASES", "STRONG_PENALTY_PHASES",
           "BASE_HINTS", "train_config", "phase_list"]


@dataclass(frozen=True)
class GroundTruthConfig:
    """Recipe of one ground-truth model: ``structure`` (as :meth:`Structure.to_dict`), ``base`` (zoo model
    whose weights it starts from; ``None``, the default: random init, number-feature initialised, with the
    architecture and tokenizer of ``arch_of``), overrides of the architecture (``n_layers``, ``d_mlp``) and
    the optimisation (see :mod:`circuits.zoo.groundtruth`; ``lr`` peak, ``warmup``/``steps`` in steps, ``margin`` and
    ``ramp_bias`` in attention-score units, ``mass_target`` a fraction of a row's attention,
    ``max_wall_s`` seconds). ``task_weights``: relative sampling weight per task (``None``: uniform).
    ``answer_balance``: the share of each task's rows drawn with every answer value equally likely
    (:func:`circuits.zoo.data.answer_balanced`) instead of every tuple. ``keep_best``: end the phase with the
    weights of its best evaluation (:mod:`circuits.zoo.groundtruth`). ``readout`` > 0: the phase refits the
    unembedding alone to the answers of ``readout`` training prompts per task (``steps`` 0; see
    :func:`circuits.zoo.groundtruth.readout_phase`).
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
    keep_best: bool = False
    answer_balance: float = 0.0
    readout: int = 0
    threads: int = 1
    task_weights: dict | None = None
    phases: tuple = ()
    description: str = ""


def _gt(name: str, wait: int, transfer: int, heads: list[list[int]], windows: list[list[str]],
        **kw) -> GroundTruthConfig:
    s = Structure(wait, transfer, tuple(tuple(h) for h in heads), tuple(tuple(w) for w in windows))
    return GroundTruthConfig(name=name, structure=s.to_dict(), **kw)


PENALTY_PHASES: tuple[JsonDict, ...] = (
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

_MARGIN = {"steps": 5000, "batch_size": 256, "warmup": 100, "eval_n": 1000, "keep_best": True,
           "max_wall_s": 3300}
MARGIN_PHASES: dict[str, JsonDict] = {
    "arith-gpt2-gt-w2t2": {**PENALTY_PHASES[2], **_MARGIN, "lr": 2e-5, "seed": 21, "task_weights": {"add_add": 4.0}},
    "arith-gpt2-gt-w3t1": {**STRONG_PENALTY_PHASES[2], **_MARGIN, "lr": 2e-5, "steps": 6000, "pen_weight": 200.0,
                           "seed": 23, "task_weights": {"add_add": 4.0, "add": 2.0, "sub_add": 2.0},
                           "answer_balance": 0.25}}
"""The margin phases of the two GPT-2 ground truths (w2t2's phase 5, w3t1's phase 8), each run from the
previously shipped weights with ``af1 zoo train NAME --continue-from FOLDER``: batch 256, 1000 held-out prompts
per task, the best evaluation kept. w2t2's lifted fresh ``add_add`` from 0.963 / 0.970 / 0.943 to 0.983 / 0.983
/ 0.953 (seeds 1 / 7 / 123); w3t1's left it at 0.950 / 0.947 / 0.933 (answer balancing at LR 2e-5 first took
the held-out accuracy to 0.27-0.50), and a readout phase after it gives the margin. See docs/groundtruth.md."""

GROUND_TRUTHS: dict[str, GroundTruthConfig] = {c.name: c for c in [
    # From the weights of the former mask-based arith-gpt2-af1 (the same wait 2, transfer 2, every head of
    # blocks 3-4 reading): the start that learned fastest under this structure. Phases 2-4 press the
    # forbidden mass down with a 10x and 50x penalty at lower LRs; phase 4 weighs add_add 3 to 1. (The
    # shipped weights ran phase 4 as 3000 steps and then resumed it, optimiser state kept, to 4000.) Phase 5,
    # MARGIN_PHASES, gives add_add a margin on fresh draws (run from the folder shipped after phase 4).
    _gt("arith-gpt2-gt-w2t2", 2, 2, [[0, 1, 2, 3], [0, 1, 2, 3]], [["all"] * 4, ["all"] * 4], base="arith-gpt2-af1",
        lr=5e-4, warmup=100, steps=6000, pen_start=500, pen_ramp=1000, max_wall_s=2700, head_dropout=0.0,
        phases=tuple({**ph, "max_wall_s": wall} for ph, wall in zip(PENALTY_PHASES, (1800, 660, 1000)))
        + (MARGIN_PHASES["arith-gpt2-gt-w2t2"],)),
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
    # kept, to 9000: 0.887) and phase 7 at LR 1e-5 with add_add weighted 4 to 1 (0.963). Phase 8
    # (MARGIN_PHASES) kept its best evaluation but not a margin on fresh draws; phase 9 refits the unembedding
    # alone to answer-balanced prompts (readout_phase), which did (phases 8-9 run from the folder shipped after
    # phase 7). Its start is w2t2 after phase 4, as of commit 0e0b2ed (BASE_HINTS).
    _gt("arith-gpt2-gt-w3t1", 3, 1, [[1, 2]], [["first", "last"]], base="arith-gpt2-gt-w2t2-phase4", seed=2,
        lr=5e-4, warmup=50, steps=8000, pen_start=0, pen_when=0.9, pen_ramp=1000, pen_weight=1.0, max_wall_s=3000,
        phases=STRONG_PENALTY_PHASES[:2] + (
            {**STRONG_PENALTY_PHASES[1], "pen_weight": 200.0, "steps": 6000, "max_wall_s": 1800, "seed": 8},
            {**STRONG_PENALTY_PHASES[2], "pen_weight": 200.0, "seed": 10},
            {**STRONG_PENALTY_PHASES[2], "lr": 3e-5, "pen_weight": 200.0, "steps": 9000, "max_wall_s": 1800,
             "seed": 16, "task_weights": {"add_add": 3.0}},
            {**STRONG_PENALTY_PHASES[2], "lr": 1e-5, "warmup": 100, "pen_weight": 200.0, "max_wall_s": 1800,
             "seed": 18, "task_weights": {"add_add": 4.0}},
            MARGIN_PHASES["arith-gpt2-gt-w3t1"],
            {"steps": 0, "readout": 15000, "answer_balance": 0.25, "task_weights": {"add_add": 2.0}, "seed": 0})),
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
    "them with `python -m circuits.zoo.planted train` (TransformerLens 3.x; writes that folder)"),
    "arith-gpt2-gt-w2t2-phase4": (
    "they are arith-gpt2-gt-w2t2 before its phase 5; in a checkout: `d=circuits/zoo/models/arith-gpt2-gt-w2t2-phase4; "
    "mkdir -p $d && git archive 0e0b2ed:circuits/zoo/models/arith-gpt2-gt-w2t2 | tar -x -C $d`")}
"""How to obtain a recipe's starting weights that the package no longer ships, by zoo name."""


def train_config(cfg: GroundTruthConfig):
    """The :class:`~circuits.zoo.recipes.TrainConfig` recorded for (and used by) ``cfg``: the architecture
    and data of ``cfg.arch_of`` with ``cfg``'s optimisation (one phase)."""
    base = get_config(cfg.arch_of)
    arch: JsonDict = {k: v for k, v in (("n_layers", cfg.n_layers), ("d_mlp", cfg.d_mlp)) if v is not None}
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


def phase_list(cfg: GroundTruthConfig) -> list[GroundTruthConfig]:
    """The phases of ``cfg``: ``cfg`` itself, then ``cfg`` with each entry of ``cfg.phases`` applied (a later
    phase starts from the weights the phase before it ends with, with a fresh AdamW, LR schedule, mask
    state and penalty schedule)."""
    return [dataclasses.replace(cfg, phases=())] + [dataclasses.replace(cfg, phases=(), **ph) for ph in cfg.phases]
