"""Training of the embedded zoo models (deterministic, resumable, CPU-friendly).

Objective: cross-entropy of the answer token at the last prompt position only (BOS at position 0, the
prompt right-padded inside a batch; causal attention makes the padding invisible to earlier positions).

Data: every valid operand tuple of each training task, minus (1) the operand tuples of every frozen
evaluation set with the same arithmetic expression (so ``add``'s frozen pairs are never seen in
``add`` nor in ``verbal_add`` ...), and (2) a validation split (about 1 tuple in 20, chosen by a fixed
hash of the tuple) used for the periodic held-out evaluation. The batch of step ``s`` is drawn with
``numpy.random.default_rng([seed, s])``, so a run is a deterministic function of its seed whether or not
it was interrupted.

Initialisation: random, except that the first 21 dimensions of every number token's embedding row and
unembedding column start as fixed Fourier features of its value (periods 10, 100, 1000) plus its
magnitude (:func:`init_number_features`); everything stays trainable. Without this head start the
number embeddings are learnt far more slowly than a CPU budget allows. ``arith-styles`` starts from the
weights of ``arith-llama`` instead.

Phases: a model's recipe is phase 1 (its :class:`TrainConfig`) followed by the :class:`Phase` entries of
``TrainConfig.phases``; each later phase starts from the final weights of the phase before it with a fresh
AdamW, its own batch size and its own warmup + cosine LR schedule. ``train(name)`` runs every phase in
order, so one call reproduces a shipped model from its seeds.

Checkpoints (``<ckpt_dir>/phase<k>/checkpoint.safetensors`` + ``optimizer.safetensors`` + ``state.json``,
``k`` 1-indexed) hold the weights, the full AdamW state (``exp_avg``/``exp_avg_sq``/``step`` per parameter,
as safetensors, no pickle) and the step; ``train(..., resume=True)`` skips finished phases and continues an
interrupted one with the same LR schedule and data.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from circuits import tasks as _tasks
from circuits.zoo.tokenizer import MAX_NUMBER, build_tokenizer, save_tokenizer

MODELS_DIR = Path(__file__).resolve().parent / "models"
ORIGINAL_TASKS = ["add", "sub", "add_add", "add_sub", "sub_add", "sub_sub"]
STYLE_TASKS = [f"{s}_{op}" for s in ("verbal", "question", "instruction", "word_problem", "python")
               for op in ("add", "sub")]


@dataclass
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


@dataclass
class TrainConfig:
    """Architecture and optimisation of one zoo model.

    ``arch`` is ``"gpt2"`` (LayerNorm, learned positions, GELU MLP) or ``"llama"`` (RMSNorm, rotary,
    grouped-query attention with ``n_key_value_heads``, gated SiLU MLP). ``steps`` is the maximum; training
    stops earlier once every task's held-out accuracy reaches ``stop_at`` at two evaluations in a row.
    ``task_weights`` weighs how often each task is sampled (see :class:`Phase`).
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
    init_from: str | None = None
    number_features: str = "fourier"
    description: str = ""
    task_weights: dict[str, float] | None = None
    phases: list[Phase] = field(default_factory=list)
    phase: int = 1

    def model_config(self, d_vocab: int) -> dict[str, Any]:
        """Keyword arguments of :class:`transformer_lens.HookedTransformerConfig` for this model."""
        cfg: dict[str, Any] = dict(
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
            raise ValueError(f"unknown arch {self.arch!r}; known: gpt2, llama")
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
}


def phase_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """One flat :class:`TrainConfig` per phase of ``cfg``: phase 1 is ``cfg`` itself, phase ``k >= 2``
    replaces steps, batch size and LR schedule by those of ``cfg.phases[k - 2]`` (no ``init_from``: it
    starts from phase ``k - 1``)."""
    import dataclasses

    for k, w in enumerate([cfg.task_weights] + [p.task_weights for p in cfg.phases], start=1):
        unknown = sorted(set(w or {}) - set(cfg.tasks))
        if unknown:
            raise ValueError(f"{cfg.name} phase {k}: task_weights names {unknown}, which the model is not "
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
        raise ValueError(f"unknown zoo model {name!r}; known models: {', '.join(REGISTRY)}")
    return REGISTRY[name]


# ----------------------------------------------------------------------------------------------- data
def _is_val(ops: np.ndarray) -> np.ndarray:
    """Fixed hash of operand tuples -> about 1 in 20 is in the validation split."""
    h = np.zeros(len(ops), dtype=np.int64)
    for j in range(ops.shape[1]):
        h = (h * 1_000_003 + ops[:, j] * 7919 + 12345) % 2_147_483_647
    return (h % 20) == 7


def _tuple_keys(ops: np.ndarray) -> np.ndarray:
    """One int64 per operand tuple (operands < 10_000), for fast set membership with ``np.isin``."""
    k = np.zeros(len(ops), dtype=np.int64)
    for j in range(ops.shape[1]):
        k = k * 10_000 + ops[:, j]
    return k


def held_out_tuples() -> dict[str, set[tuple[int, ...]]]:
    """Operand tuples of every frozen set, keyed by arithmetic expression (e.g. ``"A+B"``)."""
    out: dict[str, set[tuple[int, ...]]] = {}
    for name in _tasks.list_tasks():
        if not _tasks.frozen_path(name).exists():
            continue
        spec = _tasks.get_task(name)
        s = out.setdefault(spec.expression, set())
        for line in _tasks.frozen_path(name).read_text().splitlines():
            if line.strip():
                s.add(tuple(int(x) for x in json.loads(line)["operands"]))
    return out


def template_ids(spec: "_tasks.TaskSpec", tokenizer) -> list[int]:
    """Token ids of ``spec.template`` (without BOS) with operand slots as ``-1 - operand_index``."""
    probe = {k: 900 + i for i, k in enumerate(spec.operand_names)}  # numbers outside the vocab range
    # Pre-tokenizer pieces, not tokens: the probe numbers are not in the vocabulary on purpose.
    pieces = [p for p, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(spec.template.format(**probe))]
    vocab = tokenizer.get_vocab()
    ids = []
    for p in pieces:
        if p.isdigit() and 900 <= int(p) < 900 + spec.n_operands:
            ids.append(-1 - (int(p) - 900))
        elif p in vocab:
            ids.append(vocab[p])
        else:
            raise ValueError(f"template {spec.template!r} piece {p!r} is not in the vocabulary")
    return ids


class TaskData:
    """Token arrays of one task split: ``tokens`` [n, L] (BOS at 0), ``answers`` [n] answer token ids."""

    def __init__(self, name: str, ops: np.ndarray, tokenizer):
        spec = _tasks.get_task(name)
        vocab = tokenizer.get_vocab()
        num_ids = np.array([vocab[str(i)] for i in range(MAX_NUMBER + 1)], dtype=np.int64)
        tmpl = template_ids(spec, tokenizer)
        bos = tokenizer.bos_token_id
        toks = np.empty((len(ops), len(tmpl) + 1), dtype=np.int64)
        toks[:, 0] = bos
        for j, t in enumerate(tmpl):
            toks[:, j + 1] = num_ids[ops[:, -1 - t]] if t < 0 else t
        self.name, self.ops, self.tokens = name, ops, toks
        self.answer_values = spec.answers(ops)
        self.answers = num_ids[self.answer_values]


def build_splits(cfg: TrainConfig, tokenizer) -> tuple[list[TaskData], list[TaskData]]:
    """Training and validation :class:`TaskData` per task of ``cfg`` (frozen tuples excluded)."""
    held = held_out_tuples()
    train, val = [], []
    for name in cfg.tasks:
        spec = _tasks.get_task(name)
        ops = _tasks.task_operands(spec)
        bad = held.get(spec.expression, set())
        frozen = np.zeros(len(ops), bool)
        if bad:
            bad_arr = np.array(sorted(t for t in bad if len(t) == ops.shape[1]), dtype=np.int64)
            if len(bad_arr):
                frozen = np.isin(_tuple_keys(ops), _tuple_keys(bad_arr))
        isval = _is_val(ops) & ~frozen
        train.append(TaskData(name, ops[~frozen & ~isval], tokenizer))
        vops = ops[isval]
        vops = vops[np.random.default_rng(cfg.seed).permutation(len(vops))[: cfg.eval_n]]
        val.append(TaskData(name, vops, tokenizer))
    return train, val


def sample_batch(train: list[TaskData], step: int, cfg: TrainConfig, pad_id: int):
    """Batch of step ``step`` (0-indexed within the phase): tasks uniform (or in proportion to
    ``cfg.task_weights``), tuples uniform within a task, drawn from ``default_rng([seed, step])`` in phase 1
    and ``default_rng([seed, phase, step])`` later.
    Returns (tokens [B, L] right padded, last index [B], answer ids [B]) as numpy arrays."""
    rng = np.random.default_rng([cfg.seed, step] if cfg.phase == 1 else [cfg.seed, cfg.phase, step])
    if cfg.task_weights:
        w = np.array([cfg.task_weights.get(d.name, 1.0) for d in train], dtype=np.float64)
        task_idx = rng.choice(len(train), size=cfg.batch_size, p=w / w.sum())
    else:
        task_idx = rng.integers(0, len(train), size=cfg.batch_size)
    L = max(d.tokens.shape[1] for d in train)
    toks = np.full((cfg.batch_size, L), pad_id, dtype=np.int64)
    last = np.empty(cfg.batch_size, dtype=np.int64)
    ans = np.empty(cfg.batch_size, dtype=np.int64)
    for t in np.unique(task_idx):
        rows = np.nonzero(task_idx == t)[0]
        d = train[t]
        pick = rng.integers(0, len(d.tokens), size=len(rows))
        toks[rows, : d.tokens.shape[1]] = d.tokens[pick]
        last[rows] = d.tokens.shape[1] - 1
        ans[rows] = d.answers[pick]
    return toks, last, ans


def accuracy(model, data: TaskData, batch_size: int = 512) -> float:
    """Share of rows whose argmax at the last position is the answer token."""
    import torch

    correct = 0
    with torch.no_grad():
        for i in range(0, len(data.tokens), batch_size):
            toks = torch.from_numpy(data.tokens[i : i + batch_size])
            logits = model(toks, return_type="logits")[:, -1]
            correct += int((logits.argmax(-1) == torch.from_numpy(data.answers[i : i + batch_size])).sum())
    return correct / max(1, len(data.tokens))


# ------------------------------------------------------------------------------------------ training
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup for ``cfg.warmup`` steps, then cosine decay to ``min_lr_frac * lr`` at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def _save_optimizer(opt, model, path: Path) -> None:
    from safetensors.torch import save_file

    names = {id(p): n for n, p in model.named_parameters()}
    flat = {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k, v in st.items():
                flat[f"{names[id(p)]}::{k}"] = (v if hasattr(v, "shape") else __import__("torch").tensor(v)).detach().clone().contiguous()
    save_file(flat, str(path))


def _load_optimizer(opt, model, path: Path) -> None:
    from safetensors.torch import load_file

    flat = load_file(str(path))
    params = dict(model.named_parameters())
    for key, v in flat.items():
        pname, k = key.split("::")
        opt.state[params[pname]][k] = v


def require_hooked(what: str, model: Any = None) -> None:
    """``RuntimeError`` saying what to do unless ``HookedTransformer`` exists (TransformerLens 3.x) and
    ``model`` (if given) is one: zoo training and export work on ``HookedTransformer`` weights."""
    from interventions.adapter import resolve_backend

    hooked = resolve_backend(None) == "hooked"
    if hooked and model is not None:
        from transformer_lens import HookedTransformer

        hooked = isinstance(model, HookedTransformer)
    if not hooked:
        raise RuntimeError(
            f"{what} needs a HookedTransformer, which TransformerLens 4.0 removed: train in an environment "
            f"with transformer-lens>=3.9,<4 (the repository's .venv, `make demo` builds it); the trained "
            f"model then loads on 4.x with zoo.load(name, backend='bridge')")


def new_model(cfg: TrainConfig, tokenizer):
    """An untrained :class:`HookedTransformer` for ``cfg`` with ``tokenizer`` attached.

    Training builds a ``HookedTransformer`` (its initialisation defines the shipped models), so it needs
    TransformerLens 3.x; the trained models load on either backend (``zoo.load(name, backend=...)``)."""
    import torch

    require_hooked("training a zoo model")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(cfg.seed)
    model = HookedTransformer(HookedTransformerConfig(**cfg.model_config(len(tokenizer))), tokenizer=tokenizer)
    if cfg.number_features:
        init_number_features(model, tokenizer, cfg.number_features)
    return model


def number_features(values: "np.ndarray") -> "np.ndarray":
    """Fixed numeric features of integers, ``[len(values), 21]``: cos/sin of ``2*pi*k*n/T`` for period
    T=10 (k=1..4), T=100 (k=1..3), T=1000 (k=1..2) and ``n / MAX_NUMBER``, each column scaled to unit RMS
    over 0..MAX_NUMBER."""
    n = np.asarray(values, dtype=np.float64)[:, None]
    cols = []
    for period, ks in ((10, (1, 2, 3, 4)), (100, (1, 2, 3)), (1000, (1, 2))):
        for k in ks:
            cols += [np.cos(2 * np.pi * k * n / period), np.sin(2 * np.pi * k * n / period)]
    cols.append(n / MAX_NUMBER)
    feats = np.concatenate(cols, axis=1)
    ref = np.arange(MAX_NUMBER + 1, dtype=np.float64)
    rms = np.array([np.sqrt(np.mean(c ** 2)) for c in number_columns(ref)])
    return feats / rms


def number_columns(ref: "np.ndarray") -> list:
    """The raw feature columns of :func:`number_features` (before scaling) for a 1-D array."""
    cols = []
    for period, ks in ((10, (1, 2, 3, 4)), (100, (1, 2, 3)), (1000, (1, 2))):
        for k in ks:
            cols += [np.cos(2 * np.pi * k * ref / period), np.sin(2 * np.pi * k * ref / period)]
    cols.append(ref / MAX_NUMBER)
    return cols


def digit_features(values: "np.ndarray") -> "np.ndarray":
    """One-hot digits of integers, ``[len(values), 26]``: units (10), tens (10), hundreds (0..5)."""
    n = np.asarray(values, dtype=np.int64)
    out = np.zeros((len(n), 26))
    out[np.arange(len(n)), n % 10] = 1.0
    out[np.arange(len(n)), 10 + (n // 10) % 10] = 1.0
    out[np.arange(len(n)), 20 + np.minimum(n // 100, 5)] = 1.0
    return out * np.sqrt(26 / 3)  # unit RMS per used dimension budget


def init_number_features(model, tokenizer, kind: str = "fourier") -> None:
    """Initialisation only (all weights stay trainable): the first 21 dimensions of each number token's
    embedding and unembedding column get :func:`number_features` of its value, so training starts from
    number embeddings that already encode digits and magnitude instead of having to discover them."""
    import torch

    vocab = tokenizer.get_vocab()
    ids = [vocab[str(i)] for i in range(MAX_NUMBER + 1)]
    fn = {"fourier": number_features, "digits": digit_features}[kind]
    feats = torch.tensor(fn(np.arange(MAX_NUMBER + 1)), dtype=torch.float32)
    k = feats.shape[1]
    with torch.no_grad():
        model.embed.W_E[ids, :k] = feats
        model.unembed.W_U[:k, ids] = feats.T


def _load_weights(model, weights: dict, what: str) -> None:
    """Load ``weights`` into ``model``; a tensor whose vocabulary axis is shorter (a vocabulary that grew
    at the end, e.g. 565 -> 566 tokens) fills the shared rows/columns and keeps the rest as initialised."""
    own = model.state_dict()
    fitted = {}
    for k, v in weights.items():
        if k in own and own[k].shape != v.shape:
            if v.ndim != own[k].ndim or any(m > n for m, n in zip(v.shape, own[k].shape)):
                raise ValueError(f"{what}: {k} has shape {tuple(v.shape)}, the model needs {tuple(own[k].shape)}")
            w = own[k].clone()
            w[tuple(slice(0, m) for m in v.shape)] = v
            v = w
        fitted[k] = v
    model.load_state_dict(fitted, strict=False)


def _phase_done(state: dict, cfg: TrainConfig) -> bool:
    return state["step"] >= cfg.steps or bool(state.get("stopped_early"))


def optimizer_step(model, opt, tokens, answers, grad_clip: float, last=None) -> "torch.Tensor":
    """One optimiser step on the cross-entropy of ``answers`` predicted at index ``last`` of each row
    (``None``: the final position). Only that position is normed and unembedded. Returns the loss."""
    import torch
    import torch.nn.functional as F

    resid = model(tokens, stop_at_layer=model.cfg.n_layers)
    resid = resid[:, -1] if last is None else resid[torch.arange(len(last)), last]
    logits = model.unembed(model.ln_final(resid[:, None]))[:, 0]
    loss = F.cross_entropy(logits, answers)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return loss


def train(name: str, out_dir: str | Path | None = None, resume: bool = True, steps: int | None = None,
          ckpt_dir: str | Path | None = None, threads: int | None = 2, progress: bool = True,
          export_model: bool = True) -> dict:
    """Train zoo model ``name`` (every phase of its recipe, in order) and write it to ``out_dir``
    (default: the package's ``models/<name>``).

    Writes ``model.safetensors``, ``config.json``, ``tokenizer.json``, ``card.json`` and ``card.md``.
    Phase ``k`` (1-indexed) checkpoints to ``<ckpt_dir>/phase<k>`` (default ``ckpt_dir``:
    ``runs/zoo/<name>``); with ``resume`` a finished phase is loaded instead of rerun and an interrupted
    one continues from its checkpoint. ``steps`` overrides the number of steps of the last phase.
    Returns the card dict (or, with ``export_model=False``, the per-phase states).
    """
    import dataclasses

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = get_config(name)
    phases = phase_configs(cfg)
    if steps is not None:
        phases[-1] = dataclasses.replace(phases[-1], steps=int(steps))
    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / name
    ckpt_root = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / name
    tokenizer = build_tokenizer()
    model = new_model(cfg, tokenizer)
    states = []
    for pcfg in phases:
        states.append(_run_phase(model, pcfg, ckpt_root / f"phase{pcfg.phase}", resume, progress))
    model.eval()
    if not export_model:
        return {"phases": states}
    return export(model, cfg, out_dir, states)


def _run_phase(model, cfg: TrainConfig, ckpt_dir: Path, resume: bool, progress: bool) -> dict:
    """Run (or load, if finished) one phase on ``model`` in place; returns the phase's state dict
    (step, wall_s, history, threads, d_vocab)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    name, tokenizer = cfg.name, model.tokenizer
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and not n.startswith(("embed", "pos_embed"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and not n.startswith(("embed", "pos_embed")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    state = {"step": 0, "wall_s": 0.0, "history": [], "good_evals": 0, "d_vocab": len(tokenizer)}
    if resume and (ckpt_dir / "state.json").exists():
        state = json.loads((ckpt_dir / "state.json").read_text())
        _load_weights(model, load_file(str(ckpt_dir / "checkpoint.safetensors")), f"{ckpt_dir} checkpoint")
        if _phase_done(state, cfg):
            print(f"{name}: phase {cfg.phase} finished ({state['step']} steps), loaded from {ckpt_dir}")
            return state
        _load_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        print(f"resuming {name} phase {cfg.phase} from step {state['step']}")
    elif cfg.init_from:
        src = MODELS_DIR / cfg.init_from / "model.safetensors"
        if not src.exists():
            raise FileNotFoundError(f"{name} starts from {cfg.init_from}, but {src} does not exist: train it first")
        _load_weights(model, load_file(str(src)), str(src))
        print(f"{name}: initialised from {src}")
    train_data, val_data = build_splits(cfg, tokenizer)

    def save_ckpt():
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt_dir / "checkpoint.safetensors"))
        _save_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        (ckpt_dir / "state.json").write_text(json.dumps(state, indent=1))

    def evaluate() -> dict[str, float]:
        model.eval()
        accs = {d.name: accuracy(model, d) for d in val_data}
        model.train()
        return accs

    state["threads"] = torch.get_num_threads()
    state.update(batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup, min_lr_frac=cfg.min_lr_frac)
    t0 = time.time() - state["wall_s"]
    bar = tqdm(total=cfg.steps, initial=state["step"], desc=f"{name} phase {cfg.phase}", disable=not progress,
               mininterval=5)
    step = state["step"]
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        toks, last, ans = sample_batch(train_data, step, cfg, tokenizer.pad_token_id)
        toks, last, ans = map(torch.from_numpy, (toks, last, ans))
        loss = optimizer_step(model, opt, toks, ans, cfg.grad_clip, last=last)
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            accs = evaluate()
            state["history"].append({"step": step, "loss": loss.item(), "val": accs,
                                     "wall_s": round(time.time() - t0, 1)})
            worst = min(accs.values())
            bar.write(f"{name} phase {cfg.phase} step {step} loss {loss.item():.4f} min-val {worst:.3f} "
                      + " ".join(f"{k}={v:.3f}" for k, v in accs.items()))
            state["good_evals"] = state["good_evals"] + 1 if worst >= cfg.stop_at else 0
            if state["good_evals"] >= 2:
                bar.write(f"{name}: every task >= {cfg.stop_at} twice, stopping at step {step}")
                state["stopped_early"] = True
                break
        if step % cfg.ckpt_every == 0:
            state["step"], state["wall_s"] = step, time.time() - t0
            save_ckpt()
    bar.close()
    state["step"], state["wall_s"] = step, time.time() - t0
    save_ckpt()
    return state


def evaluate_frozen(model, task_names: list[str], n: int | None = None) -> dict[str, float]:
    """Accuracy (argmax at the last position == answer token) on each task's frozen set (first ``n`` rows)."""
    tok = model.tokenizer
    out = {}
    for name in task_names:
        ds = _tasks.frozen_set(name)
        ops = np.array(ds["operands"][: n or len(ds)], dtype=np.int64)
        out[name] = accuracy(model, TaskData(name, ops, tok))
    return out


def export(model, cfg: TrainConfig, out_dir: Path, states: list[dict]) -> dict:
    """Write weights, config, tokenizer and card of a trained model to ``out_dir``; ``states`` holds one
    state dict per phase (as :func:`train` keeps them). Returns the card."""
    from safetensors.torch import save_file

    require_hooked("exporting a zoo model", model)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in model.state_dict().items()
               if not k.endswith(("IGNORE", "mask"))}, str(out_dir / "model.safetensors"))
    mcfg = cfg.model_config(len(model.tokenizer))
    (out_dir / "config.json").write_text(json.dumps(mcfg, indent=1))
    save_tokenizer(model.tokenizer, out_dir / "tokenizer.json")
    eval_tasks = list(cfg.tasks) + [t for t in _tasks.list_tasks()
                                    if _tasks.get_task(t).group == "early_decoding" and t not in cfg.tasks]
    frozen = evaluate_frozen(model, eval_tasks)
    trained_ok = {t: frozen[t] >= cfg.bars.get(t, 0.0) for t in cfg.tasks}
    card = {
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
        "meets_bar": trained_ok,
        "skipped_styles": ([t for t in STYLE_TASKS if t not in cfg.tasks]
                           if any(t in STYLE_TASKS for t in cfg.tasks) else []),
        "history": states[-1]["history"][-5:],
    }
    (out_dir / "card.json").write_text(json.dumps(card, indent=1))
    lines = [f"# {cfg.name}", "", cfg.description, "",
             f"Trained {card['steps_run']} steps in {card['wall_time_s'] / 60:.1f} min on a shared 2-core "
             f"machine (seed {cfg.seed}), in {len(states)} phase(s):", "",
             "| phase | steps | batch | peak LR | warmup | wall time | threads | vocab |",
             "|---|---|---|---|---|---|---|---|"]
    for ph in card["phases"]:
        lines.append(f"| {ph['phase']} | {ph['steps']} | {ph['batch_size']} | {ph['lr']} | {ph['warmup']} | "
                     f"{ph['wall_time_s'] / 60:.1f} min | {ph['threads']} | {ph['d_vocab']} |")
    lines += [f"\nPhase {ph['phase']}: {ph['note']}" for ph in card["phases"] if ph.get("note")]
    lines += ["", "| task | frozen-set accuracy | bar |", "|---|---|---|"]
    for t, a in frozen.items():
        lines.append(f"| {t} | {a:.3f} | {cfg.bars.get(t, '-')} |")
    (out_dir / "card.md").write_text("\n".join(lines) + "\n")
    return card
