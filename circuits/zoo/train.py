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
weights of ``arith-gpt2`` instead.

Checkpoints (``<ckpt_dir>/checkpoint.safetensors`` + ``optimizer.safetensors`` + ``state.json``) hold the
weights, the full AdamW state (``exp_avg``/``exp_avg_sq``/``step`` per parameter, as safetensors, no
pickle) and the step; ``train(..., resume=True)`` continues from there with the same LR schedule.
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
from circuits.zoo.tokenizer import MAX_NUMBER, build_tokenizer, save_tokenizer, vocabulary

MODELS_DIR = Path(__file__).resolve().parent / "models"
ORIGINAL_TASKS = ["add", "sub", "add_add", "add_sub", "sub_add", "sub_sub"]
STYLE_TASKS = [f"{s}_{op}" for s in ("verbal", "question", "instruction", "word_problem", "python")
               for op in ("add", "sub")]


@dataclass
class TrainConfig:
    """Architecture and optimisation of one zoo model.

    ``arch`` is ``"gpt2"`` (LayerNorm, learned positions, GELU MLP) or ``"llama"`` (RMSNorm, rotary,
    grouped-query attention with ``n_key_value_heads``, gated SiLU MLP). ``steps`` is the maximum; training
    stops earlier once every task's held-out accuracy reaches ``stop_at`` at two evaluations in a row.
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


REGISTRY: dict[str, TrainConfig] = {
    "arith-gpt2": TrainConfig(
        name="arith-gpt2", arch="gpt2", tasks=list(ORIGINAL_TASKS), bars={t: 0.95 for t in ORIGINAL_TASKS},
        seed=1, steps=4000, description="GPT-2-like: LayerNorm, learned positional embeddings, GELU MLP.",
    ),
    "arith-llama": TrainConfig(
        name="arith-llama", arch="llama", tasks=list(ORIGINAL_TASKS), bars={t: 0.95 for t in ORIGINAL_TASKS},
        n_key_value_heads=2, seed=2, steps=2400,
        description="Llama-like: RMSNorm, rotary positions, grouped-query attention (4 query heads, 2 "
                    "key/value heads), gated SiLU MLP.",
    ),
    "arith-styles": TrainConfig(
        name="arith-styles", arch="gpt2", tasks=ORIGINAL_TASKS + STYLE_TASKS,
        bars={**{t: 0.95 for t in ORIGINAL_TASKS}, **{t: 0.90 for t in STYLE_TASKS}}, seed=3,
        steps=500, warmup=100, lr=1e-3, init_from="arith-gpt2",
        description="GPT-2-like, fine-tuned from arith-gpt2 on the Original tasks plus the ten input-style "
                    "templates (same architecture; tokenizer plus the word 'the').",
    ),
}


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
    """Batch of step ``step``: tasks uniform, tuples uniform within a task. Returns (tokens [B, L] right
    padded, last index [B], answer ids [B]) as numpy arrays."""
    rng = np.random.default_rng([cfg.seed, step])
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


def new_model(cfg: TrainConfig, tokenizer):
    """An untrained :class:`HookedTransformer` for ``cfg`` with ``tokenizer`` attached."""
    import torch
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


def train(name: str, out_dir: str | Path | None = None, resume: bool = True, steps: int | None = None,
          ckpt_dir: str | Path | None = None, threads: int | None = 2, progress: bool = True) -> dict:
    """Train zoo model ``name`` and write it to ``out_dir`` (default: the package's ``models/<name>``).

    Writes ``model.safetensors``, ``config.json``, ``tokenizer.json``, ``card.json`` and ``card.md``.
    Checkpoints go to ``ckpt_dir`` (default ``runs/zoo/<name>``); with ``resume`` an existing checkpoint
    is continued. ``steps`` overrides the configured maximum number of steps. Returns the card dict.
    """
    import dataclasses

    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = get_config(name)
    if steps is not None:
        cfg = dataclasses.replace(cfg, steps=int(steps))
    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out_dir) if out_dir else MODELS_DIR / name
    ckpt_dir = Path(ckpt_dir) if ckpt_dir else Path("runs") / "zoo" / name
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = new_model(cfg, tokenizer)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and not n.startswith(("embed", "pos_embed"))]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and not n.startswith(("embed", "pos_embed")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    train_data, val_data = build_splits(cfg, tokenizer)
    state = {"step": 0, "wall_s": 0.0, "history": [], "good_evals": 0}
    if cfg.init_from:
        src = MODELS_DIR / cfg.init_from / "model.safetensors"
        if not src.exists():
            raise FileNotFoundError(f"{name} starts from {cfg.init_from}, but {src} does not exist: train it first")
        own = model.state_dict()
        init = {}
        for k, v in load_file(str(src)).items():
            if k in own and own[k].shape != v.shape:
                # a vocabulary that grew at the end: copy the rows/columns both share
                w = own[k].clone()
                w[tuple(slice(0, m) for m in v.shape)] = v
                v = w
            init[k] = v
        model.load_state_dict(init, strict=False)
        print(f"{name}: initialised from {src}")
    if resume and (ckpt_dir / "state.json").exists():
        state = json.loads((ckpt_dir / "state.json").read_text())
        model.load_state_dict(load_file(str(ckpt_dir / "checkpoint.safetensors")), strict=False)
        _load_optimizer(opt, model, ckpt_dir / "optimizer.safetensors")
        print(f"resuming {name} from step {state['step']}")

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
    t0 = time.time() - state["wall_s"]
    bar = tqdm(total=cfg.steps, initial=state["step"], desc=name, disable=not progress, mininterval=5)
    step = state["step"]
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        toks, last, ans = sample_batch(train_data, step, cfg, tokenizer.pad_token_id)
        toks, last, ans = map(torch.from_numpy, (toks, last, ans))
        # Unembed only the last position: the blocks run on every position, LN/unembed on one.
        resid = model(toks, stop_at_layer=model.cfg.n_layers)[torch.arange(len(last)), last]
        logits = model.unembed(model.ln_final(resid[:, None]))[:, 0]
        loss = F.cross_entropy(logits, ans)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            accs = evaluate()
            state["history"].append({"step": step, "loss": loss.item(), "val": accs,
                                     "wall_s": round(time.time() - t0, 1)})
            worst = min(accs.values())
            bar.write(f"{name} step {step} loss {loss.item():.4f} min-val {worst:.3f} "
                      + " ".join(f"{k}={v:.3f}" for k, v in accs.items()))
            state["good_evals"] = state["good_evals"] + 1 if worst >= cfg.stop_at else 0
            if state["good_evals"] >= 2:
                bar.write(f"{name}: every task >= {cfg.stop_at} twice, stopping at step {step}")
                state["step"], state["wall_s"] = step, time.time() - t0
                save_ckpt()
                break
        if step % cfg.ckpt_every == 0:
            state["step"], state["wall_s"] = step, time.time() - t0
            save_ckpt()
    bar.close()
    state["step"], state["wall_s"] = step, time.time() - t0
    save_ckpt()
    model.eval()
    return export(model, cfg, out_dir, state)


def evaluate_frozen(model, task_names: list[str], n: int | None = None) -> dict[str, float]:
    """Accuracy (argmax at the last position == answer token) on each task's frozen set (first ``n`` rows)."""
    tok = model.tokenizer
    out = {}
    for name in task_names:
        ds = _tasks.frozen_set(name)
        ops = np.array(ds["operands"][: n or len(ds)], dtype=np.int64)
        out[name] = accuracy(model, TaskData(name, ops, tok))
    return out


def export(model, cfg: TrainConfig, out_dir: Path, state: dict) -> dict:
    """Write weights, config, tokenizer and card of a trained model to ``out_dir``; returns the card."""
    from safetensors.torch import save_file

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
        "bars": cfg.bars, "steps_run": state["step"], "wall_time_s": round(state["wall_s"], 1),
        "threads": state.get("threads"), "seed": cfg.seed,
        "init": (f"weights of {cfg.init_from}" if cfg.init_from else
                 f"random, number-token embedding/unembedding started from {cfg.number_features} features"),
        "data": "all valid operand tuples of the training tasks (operands 0..99, answers >= 0), minus every "
                "frozen-set tuple with the same expression and a hashed 5% validation split",
        "frozen_accuracy": {k: round(v, 4) for k, v in frozen.items()},
        "meets_bar": trained_ok,
        "skipped_styles": ([t for t in STYLE_TASKS if t not in cfg.tasks]
                           if any(t in STYLE_TASKS for t in cfg.tasks) else []),
        "history": state["history"][-5:],
    }
    (out_dir / "card.json").write_text(json.dumps(card, indent=1))
    lines = [f"# {cfg.name}", "", cfg.description, "",
             f"Trained {state['step']} steps in {state['wall_s'] / 60:.1f} min on {state.get('threads')} CPU "
             f"thread(s) of a shared 2-core machine (seed {cfg.seed}).",
             "", "| task | frozen-set accuracy | bar |", "|---|---|---|"]
    for t, a in frozen.items():
        lines.append(f"| {t} | {a:.3f} | {cfg.bars.get(t, '-')} |")
    (out_dir / "card.md").write_text("\n".join(lines) + "\n")
    return card
