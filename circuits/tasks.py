"""Arithmetic task catalogue: prompts, answers, frozen evaluation sets, filters and layouts.

Task specifications live in the package's data folder ``circuits/data/tasks.json`` (shipped in the
wheel, found through :mod:`importlib.resources`; override with the environment variable
``AF1_DATASETS_DIR``). Frozen evaluation sets live in ``circuits/data/frozen/<task>.jsonl``.

Conventions: the model prepends BOS, so token position 0 is BOS and the last prompt token is at
position -1 (0-indexed positions); the answer is the argmax of the next-token logits at position -1.
Operands are listed in name order (A, B, C), not in the order they appear in the template (the
``instruction_sub`` template mentions B before A).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from circuits.package_data import package_path

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from datasets import Dataset

__all__ = [
    "TaskSpec", "Layout", "list_tasks", "get_task", "build_task", "frozen_set", "filter_single_token",
    "answer_token_ids", "filter_correct", "to_layouts", "datasets_dir", "task_operands",
]

_ENUM_LIMIT = 5_000_000  # operand spaces up to this size are enumerated exhaustively


def datasets_dir() -> Path:
    """The data folder: ``$AF1_DATASETS_DIR`` if set, else ``circuits/data`` of the imported package."""
    env = os.environ.get("AF1_DATASETS_DIR")
    return Path(env) if env else package_path("data")


@dataclass(frozen=True)
class TaskSpec:
    """One arithmetic task.

    Attributes:
        name: task name, e.g. ``"add_sub"``.
        template: prompt with ``{A}``, ``{B}``, ``{C}`` placeholders, e.g. ``"{A}+{B}-{C}="``.
        expression: the answer as operand names and ``+``/``-``, evaluated left to right, e.g. ``"A+B-C"``.
        operand_names: placeholder names in order, e.g. ``("A", "B", "C")``.
        operand_ranges: inclusive ``(lo, hi)`` per operand, same order as ``operand_names``.
        answer_min, answer_max: inclusive bounds on the answer; prompts outside are never generated.
        default_n: number of prompts :func:`build_task` returns when ``n`` is None.
        group: ``"original"``, ``"style"`` or ``"early_decoding"``.
        style: input style (``"original"``, ``"verbal"``, ``"question"``, ...).
        card: one-paragraph description.
    """

    name: str
    template: str
    expression: str
    operand_names: tuple[str, ...]
    operand_ranges: tuple[tuple[int, int], ...]
    answer_min: int
    answer_max: int
    default_n: int
    group: str
    style: str
    card: str

    @property
    def n_operands(self) -> int:
        return len(self.operand_names)

    def answer(self, operands: Sequence[int]) -> int:
        """The answer for one operand tuple (given in ``operand_names`` order)."""
        return int(self.answers(np.asarray([list(operands)], dtype=np.int64))[0])

    def answers(self, operands: np.ndarray) -> np.ndarray:
        """Vectorised answers for an ``[n, n_operands]`` integer array."""
        terms = re.findall(r"([+-]?)\s*([A-Z])", self.expression)
        idx = {k: i for i, k in enumerate(self.operand_names)}
        out = np.zeros(len(operands), dtype=np.int64)
        for sign, var in terms:
            col = operands[:, idx[var]].astype(np.int64)
            out = out - col if sign == "-" else out + col
        return out

    def prompt(self, operands: Sequence[int]) -> str:
        """The prompt text (without BOS) for one operand tuple."""
        return self.template.format(**{k: int(v) for k, v in zip(self.operand_names, operands)})


@lru_cache(maxsize=4)
def _load_specs(path: str) -> dict[str, TaskSpec]:
    raw = json.loads(Path(path).read_text())
    specs = {}
    for t in raw["tasks"]:
        specs[t["name"]] = TaskSpec(
            name=t["name"], template=t["template"], expression=t["expression"],
            operand_names=tuple(t["operand_names"]),
            operand_ranges=tuple((int(lo), int(hi)) for lo, hi in t["operand_ranges"]),
            answer_min=int(t["answer_min"]), answer_max=int(t["answer_max"]),
            default_n=int(t["default_n"]), group=t["group"], style=t["style"], card=t["card"],
        )
    return specs


def _catalogue() -> dict[str, Any]:
    return json.loads((datasets_dir() / "tasks.json").read_text())


def _specs() -> dict[str, TaskSpec]:
    return _load_specs(str(datasets_dir() / "tasks.json"))


def list_tasks() -> list[str]:
    """Names of all tasks in the catalogue, in catalogue order."""
    return list(_specs())


def get_task(name: str) -> TaskSpec:
    """The :class:`TaskSpec` named ``name``; ``ValueError`` (listing the known names) if unknown."""
    specs = _specs()
    if name not in specs:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(specs)}")
    return specs[name]


def task_operands(
    spec: TaskSpec, operand_ranges: Sequence[tuple[int, int]] | None = None
) -> np.ndarray:
    """Every valid operand tuple of ``spec`` (answer within bounds) as an ``[n, n_operands]`` int64 array
    in lexicographic order. ``operand_ranges`` overrides the spec's inclusive ranges."""
    ranges = [tuple(map(int, r)) for r in (operand_ranges or spec.operand_ranges)]
    if len(ranges) != spec.n_operands:
        raise ValueError(f"task {spec.name!r} has {spec.n_operands} operands, got {len(ranges)} ranges")
    sizes = [max(0, hi - lo + 1) for lo, hi in ranges]
    total = int(np.prod(sizes))
    if total > _ENUM_LIMIT:
        raise ValueError(f"operand space of {spec.name!r} has {total} tuples, more than {_ENUM_LIMIT}")
    if total == 0:
        ops = np.zeros((0, spec.n_operands), dtype=np.int64)
    else:
        grids = np.meshgrid(*[np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in ranges], indexing="ij")
        ops = np.stack([g.reshape(-1) for g in grids], axis=1)
    ans = spec.answers(ops)
    keep = (ans >= spec.answer_min) & (ans <= spec.answer_max)
    return ops[keep]


def build_task(
    name: str, n: int | None = None, seed: int = 0,
    operand_ranges: Sequence[tuple[int, int]] | None = None,
    exclude: "set[tuple[int, ...]] | None" = None,
) -> "Dataset":
    """Prompts of task ``name`` as a Hugging Face :class:`datasets.Dataset`.

    The valid operand space (answer within the task's bounds) is enumerated exhaustively, shuffled with
    ``numpy.random.default_rng(seed)`` and truncated to ``n`` (``None`` -> the task's ``default_n``), so
    the result is a deterministic function of ``(name, n, seed, operand_ranges, exclude)``. Fewer than
    ``n`` rows are returned when the space is smaller.

    Args:
        name: task name (see :func:`list_tasks`).
        n: number of prompts; ``None`` -> ``get_task(name).default_n``.
        seed: shuffling seed.
        operand_ranges: optional inclusive ``(lo, hi)`` per operand replacing the task's ranges.
        exclude: optional operand tuples never to return (e.g. a frozen set).

    Returns:
        Dataset with columns ``prompt`` (str, without BOS), ``answer`` (int), ``operands`` (list[int], in
        A, B, C order) and ``task`` (str).

    Raises:
        ValueError: unknown task, or no operand tuple in the ranges gives a valid answer.
    """
    from datasets import Dataset

    spec = get_task(name)
    ops = task_operands(spec, operand_ranges)
    if exclude:
        mask = np.fromiter((tuple(int(x) for x in row) not in exclude for row in ops), bool, len(ops))
        ops = ops[mask]
    if len(ops) == 0:
        raise ValueError(
            f"task {name!r}: operand ranges {list(operand_ranges or spec.operand_ranges)} yield no prompt "
            f"with an answer in [{spec.answer_min}, {spec.answer_max}]"
        )
    n = spec.default_n if n is None else int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    order = np.random.default_rng(seed).permutation(len(ops))[:n]
    ops = ops[order]
    answers = spec.answers(ops)
    return Dataset.from_dict({
        "prompt": [spec.prompt(row) for row in ops],
        "answer": [int(a) for a in answers],
        "operands": [[int(x) for x in row] for row in ops],
        "task": [name] * len(ops),
    })


def frozen_path(name: str) -> Path:
    """Path of the frozen evaluation set of ``name``: ``frozen/<name>.jsonl`` in :func:`datasets_dir`."""
    return datasets_dir() / "frozen" / f"{name}.jsonl"


def frozen_set(name: str) -> "Dataset":
    """The frozen evaluation set of task ``name`` (generated once with a fixed seed; never used to train
    the zoo models). Columns as :func:`build_task`."""
    from datasets import Dataset

    get_task(name)
    path = frozen_path(name)
    if not path.exists():
        raise FileNotFoundError(f"no frozen set for task {name!r} at {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return Dataset.from_dict({
        "prompt": [r["prompt"] for r in rows], "answer": [int(r["answer"]) for r in rows],
        "operands": [[int(x) for x in r["operands"]] for r in rows], "task": [r["task"] for r in rows],
    })


def write_frozen_sets(names: Sequence[str] | None = None, overwrite: bool = False) -> list[Path]:
    """(Re)generate frozen sets with the catalogue's ``frozen_seed`` and ``frozen_n``. Existing files are
    kept unless ``overwrite``: the sets must stay fixed across versions."""
    cat = _catalogue()
    out = []
    for name in names or list_tasks():
        path = frozen_path(name)
        if path.exists() and not overwrite:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        ds = build_task(name, n=int(cat["frozen_n"]), seed=int(cat["frozen_seed"]))
        with path.open("w") as f:
            for r in ds:
                f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"], "operands": r["operands"],
                                    "task": r["task"]}) + "\n")
        out.append(path)
    return out


# ------------------------------------------------------------------------------ tokenizer-dependent
def _tokenizer_of(model_or_tokenizer):
    tok = getattr(model_or_tokenizer, "tokenizer", None)
    return tok if tok is not None else model_or_tokenizer


def _number_pieces(tokenizer, value: int) -> list[str]:
    """Tokens of ``value`` as it appears inside a prompt (no BOS, no leading space)."""
    ids = tokenizer.encode(str(int(value)), add_special_tokens=False)
    return tokenizer.convert_ids_to_tokens(ids)


def filter_single_token(
    ds: "Dataset", model_or_tokenizer, strict: bool = False, verbose: bool = True
) -> "tuple[Dataset, int]":
    """Keep the rows whose numbers (every operand and the answer) are each a single token.

    Args:
        ds: dataset with ``operands`` and ``answer`` columns (see :func:`build_task`).
        model_or_tokenizer: a HookedTransformer (its ``.tokenizer`` is used) or a Hugging Face tokenizer.
        strict: if True, raise instead of dropping (for tasks that demand single-token numbers).
        verbose: print how many rows were dropped.

    Returns:
        ``(kept_dataset, n_dropped)``.

    Raises:
        ValueError: with ``strict=True``, on the first number split into several tokens; the message
        names the number and its pieces.
    """
    tok = _tokenizer_of(model_or_tokenizer)
    cache: dict[int, list[str]] = {}
    keep: list[int] = []
    for i, (ops, ans) in enumerate(zip(ds["operands"], ds["answer"])):
        ok = True
        for v in list(ops) + [ans]:
            if v not in cache:
                cache[v] = _number_pieces(tok, v)
            if len(cache[v]) != 1 or cache[v][0] == tok.unk_token:
                if strict:
                    what = (f"is an unknown token ({cache[v][0]})" if len(cache[v]) == 1 else
                            f"is split into {len(cache[v])} tokens {cache[v]}")
                    raise ValueError(
                        f"number {v} {what} for this tokenizer, but "
                        f"the task demands single-token numbers (row {i}: {ds[i]['prompt']!r})"
                    )
                ok = False
                break
        if ok:
            keep.append(i)
    dropped = len(ds) - len(keep)
    if verbose:
        print(f"filter_single_token: kept {len(keep)}, dropped {dropped} of {len(ds)}")
    return ds.select(keep), dropped


def answer_token_ids(model, answers: Sequence[int]) -> "torch.Tensor":
    """Token id of each answer as the *next* token after the prompt, shape ``[len(answers)]`` (long).

    With the zoo tokenizers the answer token is the number itself (``str(answer)``). For tokenizers that
    fold a leading space into words (GPT-2 style BPE) the space-prefixed form is used when it is one
    token. Raises ``ValueError`` if an answer is not a single token either way.
    """
    import torch

    tok = _tokenizer_of(model)
    out = []
    for a in answers:
        ids = tok.encode(str(int(a)), add_special_tokens=False)
        if len(ids) != 1:
            ids = tok.encode(" " + str(int(a)), add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"answer {a} is not a single token: {_number_pieces(tok, a)}")
        out.append(ids[0])
    return torch.tensor(out, dtype=torch.long)


@dataclass(frozen=True)
class Layout:
    """Prompts of one token length, ready for a forward pass without padding.

    Attributes:
        tokens: ``[batch, pos]`` long tensor, BOS at position 0, last prompt token at position -1.
        answers: ``[batch]`` long tensor, answer token ids (see :func:`answer_token_ids`).
        prompts: prompt strings (without BOS), one per row.
        answer_values: integer answers, one per row.
        indices: row indices into the source dataset, one per row.
    """

    tokens: "torch.Tensor"
    answers: "torch.Tensor"
    prompts: list[str]
    answer_values: list[int]
    indices: list[int]

    @property
    def n_pos(self) -> int:
        """Token length of the layout (BOS included)."""
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def to_layouts(model, ds: "Dataset") -> list[Layout]:
    """Tokenise ``ds["prompt"]`` with the model (BOS prepended) and group rows by token length.

    Prompts of different lengths are never mixed: one :class:`Layout` per length, sorted by descending
    number of rows (ties: shorter length first). Row order inside a layout follows ``ds``.
    """
    import torch

    prompts = list(ds["prompt"])
    answers = [int(a) for a in ds["answer"]]
    if not prompts:
        return []
    ans_ids = answer_token_ids(model, answers)
    groups: dict[int, list[int]] = {}
    rows: list[torch.Tensor] = []
    tok = model.tokenizer
    # One batched call without special tokens, then BOS in front: what model.to_tokens(p) gives.
    enc = tok(prompts, add_special_tokens=False)["input_ids"]
    for i, ids in enumerate(enc):
        t = torch.tensor([tok.bos_token_id] + list(ids), dtype=torch.long)
        rows.append(t)
        groups.setdefault(len(t), []).append(i)
    layouts = []
    for length, idx in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        layouts.append(Layout(
            tokens=torch.stack([rows[i] for i in idx]).long(),
            answers=ans_ids[idx].clone(),
            prompts=[prompts[i] for i in idx],
            answer_values=[answers[i] for i in idx],
            indices=list(idx),
        ))
    return layouts


def filter_correct(model, ds: "Dataset", batch_size: int = 256) -> "tuple[Dataset, float]":
    """Keep the rows the model answers correctly: argmax of the logits at the last position equals the
    answer token. Rows are grouped by layout (token length) internally, so no padding is used.

    Returns:
        ``(correct_rows, base_accuracy)`` with base accuracy = correct / checked (0.0 for an empty ``ds``).
        Correct rows keep their original order.
    """
    import torch

    if len(ds) == 0:
        return ds, 0.0
    dev = next(model.parameters()).device
    correct: list[int] = []
    with torch.no_grad():
        for lay in to_layouts(model, ds):
            for s in range(0, len(lay), batch_size):
                logits = model(lay.tokens[s : s + batch_size].to(dev), return_type="logits")[:, -1]
                hit = (logits.argmax(-1).cpu() == lay.answers[s : s + batch_size]).tolist()
                correct += [lay.indices[s + j] for j, h in enumerate(hit) if h]
    correct.sort()
    return ds.select(correct), len(correct) / len(ds)
