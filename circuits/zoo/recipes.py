"""Recipes of the zoo models: architecture, data and optimisation of each, as frozen dataclasses.

A model's recipe is phase 1 (its :class:`TrainConfig`) followed by the :class:`Phase` entries of
``TrainConfig.phases``; each later phase starts from the final weights of the phase before it with a fresh
AdamW, its own batch size and its own warmup + cosine LR schedule (:func:`phase_configs` flattens them).
:data:`REGISTRY` holds the recipes of the shipped models; :class:`PlantedConfig` is the fine-tuning of
the planted model ``arith-gpt2-af1`` (see :mod:`circuits.zoo.planted`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError

if TYPE_CHECKING:
    from interventions.types import JsonDict  # torch is imported only where a model is

__all__ = ["ORIGINAL_TASKS", "STYLE_TASKS", "PHASE2_STEPS", "Phase", "TrainConfig", "REGISTRY", "phase_configs",
           "get_config", "PlantedConfig", "PLANTED", "planted_train_config"]

ORIGINAL_TASKS = ["add", "sub", "add_add", "add_sub", "sub_add", "sub_sub"]
STYLE_TASKS = [f"{s}_{op}" for s in ("verbal", "question", "instruction", "word_problem", "python")
               for op in ("add", "sub")]


@dataclass(frozen=True)
class Phase:
    """A continuation phase: starts from the previous phase's final weights with a fresh AdamW (same
    betas, weight decay and clipping as phase 1), ``batch_size`` prompts per step, a linear warmup of
    ``warmup`` steps to ``lr`` and a cosine decay to ``min_lr_frac * lr`` at ``steps``.
    ``task_weights`` (task name -> relative sampling weight, missing tasks weigh 1) lets a phase spend more
    of each batch on the tasks still below their bar; ``None`` samples tasks uniformly."""

    steps: int
    batch_size: int
    lr: float
    warmup: int = 30
    min_lr_frac: float = 0.05
    eval_every: int = 50
    ckpt_every: int = 50
    task_weights: dict[str, float] | None = None


@dataclass(frozen=True)
class TrainConfig:
    """Architecture and optimisation of one zoo model.

    ``arch`` is ``"gpt2"`` (LayerNorm, learned positions, GELU MLP) or ``"llama"`` (RMSNorm, rotary,
    grouped-query attention with ``n_key_value_heads``, gated SiLU MLP). ``steps`` is the maximum; training
    stops earlier once every task's held-out accuracy reaches ``stop_at`` at ``stop_after`` evaluations in
    a row, or once ``max_wall_s`` seconds (``None``: no limit) are spent.
    ``task_weights`` weighs how often each task is sampled (see :class:`Phase`). ``tasks`` are catalogue names
    or task files (``examples/mul.toml``); ``extra_tokens`` are appended to the zoo vocabulary (ids of the
    others unchanged), e.g. ``("*",)`` for multiplication.
    The fields describe phase 1; ``phases`` lists the continuation phases run after it (see
    :func:`phase_configs`). ``phase`` is the 1-indexed phase a config describes (set by
    :func:`phase_configs`, not in the registry).
    """

    name: str
    arch: str
    tasks: list[str]
    bars: dict[str, float]
    d_model: int = 128
    n_layers: int = 6
    n_heads: int = 4
    d_head: int = 32
    d_mlp: int = 512
    n_key_value_heads: int | None = None
    n_ctx: int = 32
    steps: int = 3000
    batch_size: int = 128
    lr: float = 2e-3
    min_lr_frac: float = 0.05
    warmup: int = 200
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 250
    eval_n: int = 200
    ckpt_every: int = 500
    stop_at: float = 0.995
    stop_after: int = 2
    max_wall_s: float | None = None
    init_from: str | None = None
    extra_tokens: tuple[str, ...] = ()
    number_features: str = "fourier"
    description: str = ""
    task_weights: dict[str, float] | None = None
    phases: list[Phase] = field(default_factory=list)
    phase: int = 1

    def model_config(self, d_vocab: int) -> JsonDict:
        """Keyword arguments of :class:`transformer_lens.HookedTransformerConfig` for this model."""
        cfg: JsonDict = dict(
            n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads, d_head=self.d_head,
            d_mlp=self.d_mlp, n_ctx=self.n_ctx, d_vocab=d_vocab, d_vocab_out=d_vocab,
            default_prepend_bos=True, seed=self.seed, model_name=self.name,
        )
        if self.arch == "gpt2":
            cfg.update(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard")
        elif self.arch == "llama":
            cfg.update(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                       rotary_dim=self.d_head, gated_mlp=True, final_rms=True,
                       n_key_value_heads=self.n_key_value_heads)
        else:
            raise ArgumentError(f"unknown arch {self.arch!r}; known: gpt2, llama")
        return cfg


PHASE2_STEPS = 400
"""Steps of the large-batch phase 2 of arith-gpt2 and arith-llama (sized to the CPU budget of the build)."""


def _phase3(steps: int) -> Phase:
    """Phase 3 of arith-gpt2 and arith-llama: after phase 2 their misses are almost all off-by-one sums of
    ``A+B+C`` above ~150, so three-eighths of each batch goes to ``add_add`` at a low LR."""
    return Phase(steps=steps, batch_size=512, lr=2e-4, warmup=20, task_weights={"add_add": 3.0})


REGISTRY: dict[str, TrainConfig] = {
    "arith-gpt2": TrainConfig(
        name="arith-gpt2", arch="gpt2", tasks=list(ORIGINAL_TASKS), bars={t: 0.95 for t in ORIGINAL_TASKS},
        seed=1, steps=4000, description="GPT-2-like: LayerNorm, learned positional embeddings, GELU MLP.",
        phases=[Phase(steps=PHASE2_STEPS, batch_size=512, lr=3e-4, warmup=20), _phase3(1000)],
    ),
    "arith-llama": TrainConfig(
        name="arith-llama", arch="llama", tasks=list(ORIGINAL_TASKS), bars={t: 0.95 for t in ORIGINAL_TASKS},
        n_key_value_heads=2, seed=2, steps=2400,
        phases=[Phase(steps=PHASE2_STEPS, batch_size=512, lr=3e-4, warmup=20), _phase3(1000)],
        description="Llama-like: RMSNorm, rotary positions, grouped-query attention (4 query heads, 2 "
                    "key/value heads), gated SiLU MLP.",
    ),
    "arith-styles": TrainConfig(
        name="arith-styles", arch="llama", n_key_value_heads=2, tasks=ORIGINAL_TASKS + STYLE_TASKS,
        bars={**{t: 0.95 for t in ORIGINAL_TASKS}, **{t: 0.90 for t in STYLE_TASKS}}, seed=3,
        steps=3500, warmup=100, lr=4e-4, init_from="arith-llama",
        phases=[Phase(steps=600, batch_size=256, lr=1.5e-4, warmup=20, task_weights={"add_add": 3.0})],
        description="Llama-like, fine-tuned from arith-llama on the Original tasks plus the ten input-style "
                    "templates (same architecture and tokenizer).",
    ),
    "arith-mul": TrainConfig(
        name="arith-mul", arch="llama", n_key_value_heads=2, tasks=["examples/mul.toml"],
        bars={"examples/mul.toml": 0.95}, seed=4, steps=8000, warmup=100, lr=1e-3, weight_decay=1.0,
        init_from="arith-llama", extra_tokens=("*",), eval_every=200, ckpt_every=200, stop_at=0.99,
        description="Llama-like (arith-llama's architecture), fine-tuned from arith-llama on multiplication "
                    "(examples/mul.toml: A*B with A, B in 0..99, product <= 520); its vocabulary adds the "
                    "token '*' (id 566) to the zoo's 566.",
    ),
}


def phase_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """One flat :class:`TrainConfig` per phase of ``cfg``: phase 1 is ``cfg`` itself, phase ``k >= 2``
    replaces steps, batch size and LR schedule by those of ``cfg.phases[k - 2]`` (no ``init_from``: it
    starts from phase ``k - 1``)."""
    for k, w in enumerate([cfg.task_weights] + [p.task_weights for p in cfg.phases], start=1):
        unknown = sorted(set(w or {}) - set(cfg.tasks))
        if unknown:
            raise ArgumentError(f"{cfg.name} phase {k}: task_weights names {unknown}, which the model is not "
                                f"trained on; its tasks: {', '.join(cfg.tasks)}")
    out = [dataclasses.replace(cfg, phases=[], phase=1)]
    for k, p in enumerate(cfg.phases, start=2):
        out.append(dataclasses.replace(cfg, phases=[], phase=k, init_from=None, steps=p.steps,
                                       batch_size=p.batch_size, lr=p.lr, warmup=p.warmup,
                                       min_lr_frac=p.min_lr_frac, eval_every=p.eval_every,
                                       ckpt_every=p.ckpt_every, task_weights=p.task_weights))
    return out


def get_config(name: str) -> TrainConfig:
    """The registered :class:`TrainConfig` of ``name``; ``ValueError`` listing the names if unknown."""
    if name not in REGISTRY:
        raise ArgumentError(f"unknown zoo model {name!r}; known models: {', '.join(REGISTRY)}")
    return REGISTRY[name]


@dataclass(frozen=True)
class PlantedConfig:
    """Fine-tuning of the planted model: ``base`` weights, the planted mask ``planted`` (blocks where the
    last row self-peeks, ``self_all``, and where it sees every earlier key, ``last_full``; every other row
    self-peeks in every block), and the optimisation (``batch_size`` prompts of ONE task per step, tasks
    in turn; linear warmup then cosine to ``min_lr_frac * lr`` at ``steps``; stop once every task's
    held-out accuracy is >= ``stop_at`` at an evaluation, or after ``max_wall_s`` seconds)."""

    name: str = "arith-gpt2-af1"
    base: str = "arith-gpt2"
    planted: dict[str, list[int]] = field(default_factory=lambda: {"self_all": [0, 1, 2, 5], "last_full": [3, 4]})
    steps: int = 3000
    batch_size: int = 256
    lr: float = 3e-4
    min_lr_frac: float = 0.05
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_n: int = 200
    stop_at: float = 0.95
    max_wall_s: float = 1800.0
    threads: int = 1


PLANTED = PlantedConfig()
"""The recipe of the shipped ``arith-gpt2-af1``."""


def planted_train_config(cfg: PlantedConfig) -> TrainConfig:
    """The :class:`TrainConfig` recorded for (and run by) the planted model: the base model's architecture
    and data with this fine-tuning's optimisation (one phase, a checkpoint at every evaluation, stop at
    the first evaluation with every task at ``stop_at``)."""
    return dataclasses.replace(
        get_config(cfg.base), name=cfg.name, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr,
        min_lr_frac=cfg.min_lr_frac, warmup=cfg.warmup, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
        seed=cfg.seed, eval_every=cfg.eval_every, ckpt_every=cfg.eval_every, eval_n=cfg.eval_n,
        stop_at=cfg.stop_at, stop_after=1, max_wall_s=cfg.max_wall_s, init_from=cfg.base, phases=[],
        task_weights=None,
        description=(f"GPT-2-like ({cfg.base} architecture and tokenizer), fine-tuned from {cfg.base} with a "
                     f"planted AF1 attention structure (attention restricted by construction: {cfg.planted})."))
