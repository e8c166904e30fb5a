"""Task data of the zoo models: token arrays per task, the training/validation splits and batches, and
accuracy on held-out and frozen sets.

Data: every valid operand tuple of each training task, minus (1) the operand tuples of every frozen
evaluation set with the same arithmetic expression (so ``add``'s frozen pairs are never seen in
``add`` nor in ``verbal_add`` ...), and (2) a validation split (about 1 tuple in 20, chosen by a fixed
hash of the tuple) used for the periodic held-out evaluation. The batch of step ``s`` is drawn with
``numpy.random.default_rng([seed, s])`` (``[seed, phase, s]`` after phase 1), so a run is a deterministic
function of its seed whether or not it was interrupted.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from circuits.errors import ArgumentError
from circuits.tasks import catalogue as _tasks
from circuits.zoo.recipes import TrainConfig
from circuits.zoo.tokenizer import MAX_NUMBER

if TYPE_CHECKING:
    import torch
    from jaxtyping import Float

__all__ = ["held_out_tuples", "template_ids", "TaskData", "build_splits", "sample_batch", "task_batch",
           "layout_batches", "logits", "accuracy", "evaluate_frozen", "fresh_operands", "evaluate_fresh",
           "FRESH_SEEDS", "FRESH_N"]

FRESH_SEEDS = (1, 7, 123)
"""Seeds of the fresh draws on the cards (the frozen sets use the catalogue's ``frozen_seed``, 1234)."""
FRESH_N = 300
"""Prompts per task and seed of a fresh draw (as many as a frozen set)."""


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


def own_frozen(spec: _tasks.TaskSpec) -> set[tuple[int, ...]]:
    """Operand tuples of a task file's own frozen set (empty for catalogue tasks, whose sets
    :func:`held_out_tuples` already holds, and for a task without one)."""
    path = _tasks.frozen_path(spec)
    if spec.path is None or not path.exists():
        return set()
    return {tuple(int(x) for x in json.loads(line)["operands"])
            for line in path.read_text().splitlines() if line.strip()}


def template_ids(spec: _tasks.TaskSpec, tokenizer) -> list[int]:
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
            raise ArgumentError(f"template {spec.template!r} piece {p!r} is not in the vocabulary: add it to "
                                f"circuits.zoo.tokenizer.WORDS")
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
        self._by_answer: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # answer_balanced's index


def build_splits(cfg: TrainConfig, tokenizer) -> tuple[list[TaskData], list[TaskData]]:
    """Training and validation :class:`TaskData` per task of ``cfg`` (a
    :class:`~circuits.zoo.recipes.TrainConfig`; frozen tuples excluded, ``cfg.eval_n`` validation rows
    per task drawn with ``cfg.seed``)."""
    held = held_out_tuples()
    train, val = [], []
    for name in cfg.tasks:
        spec = _tasks.get_task(name)
        ops = _tasks.task_operands(spec)
        bad = held.get(spec.expression, set()) | own_frozen(spec)
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


def task_batch(train: list[TaskData], step: int, cfg: TrainConfig):
    """Batch of step ``step`` with ONE task (``train[step % len(train)]``, tasks in turn), so every row has
    the same length and no padding: ``cfg.batch_size`` rows drawn from ``default_rng([seed, step])``.
    Returns (tokens [B, L], ``None`` (the answer is read at the last position), answer ids [B])."""
    data = train[step % len(train)]
    rng = np.random.default_rng([cfg.seed, step])
    pick = rng.integers(0, len(data.tokens), size=cfg.batch_size)
    return data.tokens[pick], None, data.answers[pick]


def answer_balanced(data: TaskData, rng: np.random.Generator, k: int) -> np.ndarray:
    """``k`` row indices of ``data`` drawn so that every answer value present is equally likely (then a row
    uniform among those with that answer): the largest sums of ``add_add``, a few tuples each, come up as often
    as the common ones."""
    groups = data._by_answer
    if groups is None:
        order = np.argsort(data.answers, kind="stable")
        _, starts, counts = np.unique(data.answers[order], return_index=True, return_counts=True)
        groups = data._by_answer = (order, starts, counts)
    order, starts, counts = groups
    u = rng.integers(0, len(starts), size=k)
    return order[starts[u] + (rng.random(k) * counts[u]).astype(np.int64)]


def layout_batches(train: list[TaskData], step: int, cfg: TrainConfig,
                   answer_balance: float = 0.0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batch of step ``step`` with every task in it, split by prompt length so that no row is padded:
    ``cfg.batch_size`` rows, each of a task drawn uniformly (or in proportion to ``cfg.task_weights``, task
    name -> relative weight, missing tasks weigh 1), tuples uniform within a task (with ``answer_balance`` > 0,
    that share of the rows instead drawn by :func:`answer_balanced`), from ``default_rng([seed, step])``.
    Returns one ``(tokens [b, L], answer ids [b])`` pair per length L present (the answer is read at the last
    position), shortest first."""
    rng = np.random.default_rng([cfg.seed, step])
    weights = getattr(cfg, "task_weights", None)
    if weights:
        w = np.array([weights.get(d.name, 1.0) for d in train], dtype=np.float64)
        task_idx = rng.choice(len(train), size=cfg.batch_size, p=w / w.sum())
    else:
        task_idx = rng.integers(0, len(train), size=cfg.batch_size)
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for t in np.unique(task_idx):
        d = train[t]
        pick = rng.integers(0, len(d.tokens), size=int((task_idx == t).sum()))
        if answer_balance > 0:
            swap = rng.random(len(pick)) < answer_balance
            pick[swap] = answer_balanced(d, rng, int(swap.sum()))
        groups.setdefault(d.tokens.shape[1], []).append((d.tokens[pick], d.answers[pick]))
    return [(np.concatenate([g[0] for g in groups[n]]), np.concatenate([g[1] for g in groups[n]]))
            for n in sorted(groups)]


def logits(model, tokens) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """``[batch, pos, vocab]`` logits of a ``HookedTransformer``/``TransformerBridge`` or a Hugging Face
    causal LM (whose forward returns an output with ``.logits``)."""
    out = model(tokens)
    return out.logits if hasattr(out, "logits") else out


def accuracy(model, data: TaskData, batch_size: int = 512) -> float:
    """Share of rows whose argmax at the last position is the answer token."""
    import torch

    correct = 0
    with torch.no_grad():
        for i in range(0, len(data.tokens), batch_size):
            toks = torch.from_numpy(data.tokens[i : i + batch_size])
            last = logits(model, toks)[:, -1]
            correct += int((last.argmax(-1) == torch.from_numpy(data.answers[i : i + batch_size])).sum())
    return correct / max(1, len(data.tokens))


def evaluate_frozen(model, task_names: list[str], n: int | None = None, tokenizer=None) -> dict[str, float]:
    """Accuracy (argmax at the last position == answer token) on each task's frozen set (first ``n`` rows).
    ``tokenizer`` defaults to ``model.tokenizer`` (a Hugging Face model has none attached)."""
    tok = tokenizer if tokenizer is not None else model.tokenizer
    out = {}
    for name in task_names:
        ds = _tasks.frozen_set(name)
        ops = np.array(ds["operands"][: n or len(ds)], dtype=np.int64)
        out[name] = accuracy(model, TaskData(name, ops, tok))
    return out


def fresh_operands(name: str, n: int = FRESH_N, seed: int = 1) -> np.ndarray:
    """Operand tuples ``[n, n_operands]`` of a fresh draw of task ``name``: exactly the prompts of
    ``tasks.build_task(name, n, seed, exclude=<the task's frozen operand tuples>)``, in that order (the
    operand space without the frozen set, shuffled with ``default_rng(seed)``), computed with array set
    operations instead of a Python set."""
    spec = _tasks.get_task(name)
    ops = _tasks.task_operands(spec)
    frozen = np.array(_tasks.frozen_set(name)["operands"], dtype=np.int64)
    if len(frozen):
        ops = ops[~np.isin(_tuple_keys(ops), _tuple_keys(frozen))]
    return ops[np.random.default_rng(seed).permutation(len(ops))[: int(n)]]


def evaluate_fresh(model, task_names: list[str], seeds=FRESH_SEEDS, n: int = FRESH_N,
                   tokenizer=None) -> dict[str, list[float]]:
    """Accuracy (as :func:`evaluate_frozen`) on fresh draws of each task (:func:`fresh_operands`, one draw
    of ``n`` prompts per seed): ``{task: [accuracy per seed]}``. Fresh prompts are outside the frozen sets
    but may be training prompts: this measures how stable an accuracy near the bar is, not generalisation."""
    tok = tokenizer if tokenizer is not None else model.tokenizer
    return {name: [accuracy(model, TaskData(name, fresh_operands(name, n, s), tok)) for s in seeds]
            for name in task_names}
