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
        group: ``"original"``, ``"style"``, ``"early_decoding"`` or ``"digits"`` (several-token numbers).
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
    try:
        return _parse_specs(path)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as err:
        from circuits.errors import ArgumentError

        what = f"missing field {err}" if isinstance(err, KeyError) else " ".join(str(err).split())[:160]
        raise ArgumentError(f"task catalogue {path} is malformed ({what}): it needs {{\"tasks\": [...]}} with the "
                            f"fields of circuits/data/tasks.json; fix it or unset AF1_DATASETS_DIR") from None


def _parse_specs(path: str) -> dict[str, TaskSpec]:
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
    start: int = 0,
) -> "Dataset":
    """Prompts of task ``name`` as a Hugging Face :class:`datasets.Dataset`.

    The valid operand space (answer within the task's bounds) is enumerated exhaustively, shuffled with
    ``numpy.random.default_rng(seed)`` and rows ``start .. start + n - 1`` of that order are returned
    (``n=None`` -> the task's ``default_n``), so the result is a deterministic function of
    ``(name, n, seed, operand_ranges, exclude, start)`` and consecutive ``start`` windows of one seed
    never repeat a prompt. Fewer than ``n`` rows are returned when the space ends first.

    Args:
        name: task name (see :func:`list_tasks`).
        n: number of prompts; ``None`` -> ``get_task(name).default_n``.
        seed: shuffling seed.
        operand_ranges: optional inclusive ``(lo, hi)`` per operand replacing the task's ranges.
        exclude: optional operand tuples never to return (e.g. a frozen set).
        start: first row (0-indexed) of the shuffled operand space to return.

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
    if int(start) < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    order = np.random.default_rng(seed).permutation(len(ops))[int(start) : int(start) + n]
    ops = ops[order]
    answers = spec.answers(ops)
    return Dataset.from_dict({
        "prompt": [spec.prompt(row) for row in ops],
        "answer": [int(a) for a in answers],
        "operands": [[int(x) for x in row] for row in ops],
        "task": [name] * len(ops),
    })


def operand_space_size(name: str, operand_ranges: Sequence[tuple[int, int]] | None = None) -> int:
    """Number of distinct prompts of task ``name``: its valid operand tuples (answer within bounds)."""
    return int(len(task_operands(get_task(name), operand_ranges)))


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
# Filters, answer tokens and layouts live in circuits.task_tokens (they depend on the model's tokenizer).
from circuits.task_tokens import (  # noqa: E402
    Layout, answer_form, answer_token_ids, filter_correct, filter_single_token, number_tokens, resolve_bos,
    single_token_ranges, to_layouts,
)

__all__ += ["operand_space_size", "number_tokens", "single_token_ranges", "answer_form", "resolve_bos"]
