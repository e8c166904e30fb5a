"""The task catalogue and tasks of one's own: prompts, answers, frozen evaluation sets, filters and layouts.

Task specifications are task files (:mod:`circuits.tasks.files`: a template with named slots, each slot's
values, the answer as an expression or a lookup column). The shipped catalogue lives in the data folder,
``datasets/tasks/`` of the repository (``catalogue.toml`` lists the names in order, one ``<name>.toml`` per task;
shipped in the wheel as ``circuits/data/``, found through :mod:`importlib.resources`,
:mod:`circuits.tasks.package_data`; ``AF1_DATASETS_DIR`` points at another data folder of the same layout, or at
one holding a ``tasks.json`` of the earlier format). Frozen evaluation sets live in ``datasets/frozen/<task>.jsonl``.
Every function taking a task name also takes the path of a task file (``.toml`` / ``.json``; a relative path not
found from the working directory is looked up in the data folder, so ``examples/mul.toml`` names a shipped example)
or a :class:`TaskSpec`.

Conventions: the model prepends BOS, so token position 0 is BOS and the last prompt token is at
position -1 (0-indexed positions); the answer is the argmax of the next-token logits at position -1.
Operands are listed in slot order (A, B, C), not in the order they appear in the template (the
``instruction_sub`` template mentions B before A). A slot of string values is an operand holding the index
of its value (0-indexed, in the order of the file's list).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuits.errors import ArgumentError, did_you_mean
from circuits.tasks import operand_space
from circuits.tasks.files import (
    CATALOGUE,
    FROZEN_N,
    FROZEN_SEED,
    catalogue_fields,
    evaluate,
    legacy_catalogue,
    read_frozen,
    read_mapping,
    spec_fields,
)
from circuits.tasks.package_data import datasets_dir, find_file

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = [
    "TaskSpec", "Layout", "list_tasks", "get_task", "load_task", "task_label", "build_task", "frozen_set",
    "filter_single_token", "answer_token_ids", "filter_correct", "to_layouts", "datasets_dir", "task_operands",
]

NO_MIN, NO_MAX = operand_space.NO_MIN, operand_space.NO_MAX
"""``answer_min`` / ``answer_max`` of a task without bounds."""


@dataclass(frozen=True)
class TaskSpec:
    """One task.

    Attributes:
        name: task name, e.g. ``"add_sub"``.
        template: prompt with ``{slot}`` placeholders, e.g. ``"{A}+{B}-{C}="``.
        expression: the answer as an expression over integer slots with ``+ - *`` and parentheses, e.g.
            ``"A+B-C"`` (``""`` for a lookup).
        operand_names: slot names in order, e.g. ``("A", "B", "C")``.
        operand_ranges: inclusive ``(lo, hi)`` per slot, same order as ``operand_names`` (for a slot of
            string values, the index range ``(0, len(values) - 1)``).
        answer_min, answer_max: inclusive bounds on an integer answer; prompts outside are never generated.
        default_n: number of prompts :func:`build_task` returns when ``n`` is None.
        group: ``"original"``, ``"style"``, ``"early_decoding"``, ``"digits"`` or a task file's own.
        style: input style (``"original"``, ``"verbal"``, ``"question"``, ...).
        card: one-paragraph description.
        slot_values: per slot its string values, ``None`` for an integer slot (``()``: every slot integer).
        lookup: ``(slot, ((value, answer), ...))`` when the answer is a lookup column, else ``None``.
        prefix: text before every prompt (e.g. solved examples).
        answer_format: how the answer is written after the prompt, ``"{}"`` or e.g. ``" {}"``.
        path: the task file it was read from (``None`` for the catalogue's tasks and in-memory specs).
        frozen_file: its frozen set (JSON lines), ``frozen_seed`` / ``frozen_n``: how it is drawn.
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
    slot_values: tuple[tuple[str, ...] | None, ...] = ()
    lookup: tuple[str, tuple[tuple[str, str], ...]] | None = None
    prefix: str = ""
    answer_format: str = "{}"
    path: str | None = None
    frozen_file: str | None = None
    frozen_seed: int = FROZEN_SEED
    frozen_n: int = FROZEN_N

    @property
    def n_operands(self) -> int:
        return len(self.operand_names)

    @property
    def numeric(self) -> bool:
        """Whether answers are integers (an expression), not strings (a lookup column)."""
        return self.lookup is None

    @property
    def label(self) -> str:
        """How runs name the task: the file path of a task file, else the name."""
        return self.path or self.name

    def answer(self, operands: Sequence[int]) -> int | str:
        """The answer for one operand tuple (given in ``operand_names`` order)."""
        a = self.answers(np.asarray([list(operands)], dtype=np.int64))[0]
        return a if isinstance(a, str) else int(a)

    def answers(self, operands: np.ndarray) -> np.ndarray:
        """Vectorised answers for an ``[n, n_operands]`` integer array: int64, or strings (object) for a lookup."""
        if self.lookup is not None:
            slot, table = self.lookup
            col = np.array([a for _, a in table] or [""], dtype=object)
            return col[np.asarray(operands, dtype=np.int64)[:, self.operand_names.index(slot)]]
        ops = np.asarray(operands, dtype=np.int64).reshape(len(operands), self.n_operands)
        return evaluate(self.expression, {k: ops[:, i] for i, k in enumerate(self.operand_names)})

    def answer_text(self, answer: Any) -> str:
        """The answer as written after the prompt (``answer_format`` applied)."""
        return self.answer_format.format(answer if isinstance(answer, str) else int(answer))

    def value(self, index: int, operand: int) -> int | str:
        """The value slot ``index`` shows for ``operand`` (its string for a slot of string values)."""
        values = self.slot_values[index] if self.slot_values else None
        return int(operand) if values is None else values[int(operand)]

    def prompt(self, operands: Sequence[int]) -> str:
        """The prompt text (without BOS) for one operand tuple."""
        return self.prefix + self.template.format(
            **{k: self.value(i, v) for i, (k, v) in enumerate(zip(self.operand_names, operands))})


@lru_cache(maxsize=4)
def _load_specs(path: str) -> dict[str, TaskSpec]:
    """A catalogue in the earlier one-file format (``tasks.json``), for an ``AF1_DATASETS_DIR`` that holds one."""
    return {name: TaskSpec(**fields) for name, fields in legacy_catalogue(path).items()}


@lru_cache(maxsize=4)
def _load_catalogue(folder: str) -> dict[str, TaskSpec]:
    """The catalogue of a ``tasks/`` folder (:func:`circuits.tasks.files.catalogue_fields`)."""
    return {name: TaskSpec(**fields) for name, fields in catalogue_fields(folder).items()}


def _specs() -> dict[str, TaskSpec]:
    data = datasets_dir()
    if (data / "tasks" / CATALOGUE).exists():
        return _load_catalogue(str(data / "tasks"))
    if (data / "tasks.json").exists():
        return _load_specs(str(data / "tasks.json"))
    raise ArgumentError(f"task catalogue: {data} holds neither tasks/{CATALOGUE} nor tasks.json; point "
                        f"AF1_DATASETS_DIR at a copy of the datasets/ folder (or unset it)")


def list_tasks() -> list[str]:
    """Names of all tasks in the catalogue, in catalogue order."""
    return list(_specs())


@lru_cache(maxsize=64)
def _load_file(path: str, stamp: tuple[int, int]) -> TaskSpec:
    p = Path(path)
    fields = spec_fields(read_mapping(p), path, base=p.parent)
    return TaskSpec(**fields, path=path)


def task_path(task: str) -> Path | None:
    """The file a task string names (a ``.toml`` / ``.json`` path, found by
    :func:`circuits.tasks.package_data.find_file`: as given, else below :func:`datasets_dir`), or ``None`` for a
    catalogue name."""
    if not str(task).lower().endswith((".toml", ".json")):
        return None
    return find_file(task)


def load_task(path: str | Path) -> TaskSpec:
    """The :class:`TaskSpec` of the task file ``path`` (``.toml`` or ``.json``, see :mod:`circuits.tasks.files`),
    checked; re-read when the file changes. One-line :class:`~circuits.errors.ArgumentError` naming the file
    and the field on any problem."""
    p = task_path(str(path)) or Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ArgumentError(f"task file {p} does not exist: give the path of a .toml or .json task file") from None
    return _load_file(str(p), (st.st_mtime_ns, st.st_size))


TaskLike = str | Path | TaskSpec


def get_task(task: TaskLike) -> TaskSpec:
    """The :class:`TaskSpec` of ``task``: a catalogue name, a task file path or a spec (returned as it is);
    :class:`~circuits.errors.ArgumentError` (a ``ValueError``, listing the known names) if unknown."""
    if isinstance(task, TaskSpec):
        return task
    if isinstance(task, Path) or task_path(str(task)) is not None:
        return load_task(task)
    specs = _specs()
    if task not in specs:
        raise ArgumentError(f"unknown task {task!r}; {did_you_mean(str(task), list(specs))}known tasks: "
                            f"{', '.join(specs)}, or the path of a task file (.toml / .json, see docs/tasks.md)")
    return specs[task]


def known_task(task: Any) -> bool:
    """Whether ``task`` names a task without reading it: a :class:`TaskSpec`, a task file path or a catalogue name
    (a caller's own prompt loader may name others)."""
    return isinstance(task, TaskSpec) or task_path(str(task)) is not None or task in list_tasks()


def task_label(task: TaskLike | None) -> str:
    """How a task is named in run files and messages: its catalogue name, its file path, or its name (``"None"``
    for no task)."""
    if isinstance(task, TaskSpec):
        return task.label
    return str(task)


def task_operands(
    spec: TaskSpec, operand_ranges: Sequence[tuple[int, int]] | None = None
) -> np.ndarray:
    """Every valid operand tuple of ``spec`` (answer within bounds) as an ``[n, n_operands]`` int64 array
    in lexicographic order. ``operand_ranges`` overrides the spec's inclusive ranges. A space of more than
    :data:`circuits.tasks.operand_space.ENUM_LIMIT` tuples is refused (:class:`~circuits.errors.ArgumentError`):
    :func:`build_task` draws from it instead."""
    return operand_space.enumerate_operands(spec, operand_ranges)


def build_task(
    name: TaskLike, n: int | None = None, seed: int = 0,
    operand_ranges: Sequence[tuple[int, int]] | None = None,
    exclude: set[tuple[int, ...]] | None = None,
    start: int = 0,
) -> Dataset:
    """Prompts of task ``name`` as a Hugging Face :class:`datasets.Dataset`.

    The valid operand space (answer within the task's bounds) is enumerated exhaustively, shuffled with
    ``numpy.random.default_rng(seed)`` (a space of more than 5 M tuples: drawn from, uniformly and without
    replacement, in an order fixed by ``seed``; :mod:`circuits.tasks.operand_space`) and rows
    ``start .. start + n - 1`` of that order are returned
    (``n=None`` -> the task's ``default_n``), so the result is a deterministic function of
    ``(name, n, seed, operand_ranges, exclude, start)`` and consecutive ``start`` windows of one seed
    never repeat a prompt. Fewer than ``n`` rows are returned when the space ends first.

    Args:
        name: task name (see :func:`list_tasks`), task file path or :class:`TaskSpec`.
        n: number of prompts; ``None`` -> ``get_task(name).default_n``.
        seed: shuffling seed.
        operand_ranges: optional inclusive ``(lo, hi)`` per operand replacing the task's ranges.
        exclude: optional operand tuples never to return (e.g. a frozen set).
        start: first row (0-indexed) of the shuffled operand space to return.

    Returns:
        Dataset with columns ``prompt`` (str, without BOS), ``answer`` (int; str for a lookup), ``operands``
        (list[int], in slot order; a string slot's value index) and ``task`` (str, the task's name); plus
        ``answer_text`` (the answer as the task file writes it after the prompt) for a lookup or an
        ``answer_format`` other than ``"{}"``.

    Raises:
        ArgumentError: unknown task, or no operand tuple in the ranges gives a valid answer.
    """
    from datasets import Dataset

    spec = get_task(name)
    n = spec.default_n if n is None else int(n)
    if n < 0:
        raise ArgumentError(f"n must be >= 0, got {n}")
    if int(start) < 0:
        raise ArgumentError(f"start must be >= 0, got {start}")
    ops = operand_space.ordered_operands(spec, n, seed, operand_ranges, exclude, int(start))
    answers = [a if isinstance(a, str) else int(a) for a in spec.answers(ops)]
    cols: dict[str, list[Any]] = {
        "prompt": [spec.prompt(row) for row in ops],
        "answer": answers,
        "operands": [[int(x) for x in row] for row in ops],
        "task": [spec.name] * len(ops),
    }
    if not spec.numeric or spec.answer_format != "{}":
        cols["answer_text"] = [spec.answer_text(a) for a in answers]
    return Dataset.from_dict(cols)


def operand_space_size(name: TaskLike, operand_ranges: Sequence[tuple[int, int]] | None = None) -> int:
    """Number of distinct prompts of task ``name``: its valid operand tuples (answer within bounds); for a space
    of more than 5 M tuples an estimate (:func:`operand_space_count` says which)."""
    return operand_space_count(name, operand_ranges).n


def operand_space_count(name: TaskLike, operand_ranges: Sequence[tuple[int, int]] | None = None
                        ) -> operand_space.SpaceSize:
    """:func:`operand_space_size` with whether it was counted or estimated
    (:func:`circuits.tasks.operand_space.space_size`)."""
    return operand_space.space_size(get_task(name), operand_ranges)


def frozen_path(name: TaskLike) -> Path:
    """Path of the frozen evaluation set of ``name``: ``frozen/<name>.jsonl`` in :func:`datasets_dir` for a
    catalogue task, a task file's ``frozen`` (else ``<file>.frozen.jsonl`` beside it)."""
    spec = get_task(name)
    if spec.frozen_file:
        return Path(spec.frozen_file)
    if spec.path:
        return Path(spec.path).with_suffix(".frozen.jsonl")
    return datasets_dir() / "frozen" / f"{spec.name}.jsonl"


def frozen_set(name: TaskLike) -> Dataset:
    """The frozen evaluation set of task ``name`` (generated once with a fixed seed; never used to train
    the zoo models). Columns as :func:`build_task`."""
    from datasets import Dataset

    spec = get_task(name)
    path = frozen_path(spec)
    if not path.exists():
        raise FileNotFoundError(f"no frozen set for task {task_label(name)!r} at {path}")
    rows = read_frozen(path, spec.n_operands)
    cols: dict[str, list[Any]] = {
        "prompt": [r["prompt"] for r in rows],
        "answer": [r["answer"] if isinstance(r["answer"], str) else int(r["answer"]) for r in rows],
        "operands": [[int(x) for x in r["operands"]] for r in rows], "task": [r["task"] for r in rows],
    }
    if not spec.numeric or spec.answer_format != "{}":
        cols["answer_text"] = [spec.answer_text(a) for a in cols["answer"]]
    return Dataset.from_dict(cols)


def write_frozen_sets(names: Sequence[TaskLike] | None = None, overwrite: bool = False) -> list[Path]:
    """(Re)generate frozen sets with each task's ``frozen_seed`` and ``frozen_n`` (the catalogue's: 20250901
    and 300). Existing files are kept unless ``overwrite``: the sets must stay fixed across versions."""
    out = []
    for name in names or list_tasks():
        spec = get_task(name)
        path = frozen_path(spec)
        if path.exists() and not overwrite:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        ds = build_task(spec, n=spec.frozen_n, seed=spec.frozen_seed)
        with path.open("w") as f:
            for r in ds:
                f.write(json.dumps({"prompt": r["prompt"], "answer": r["answer"], "operands": r["operands"],
                                    "task": r["task"]}) + "\n")
        out.append(path)
    return out


# ------------------------------------------------------------------------------ tokenizer-dependent
# Filters, answer tokens and layouts live in circuits.tasks.tokens (they depend on the model's tokenizer).
from circuits.tasks.tokens import (  # noqa: E402
    Layout,
    answer_form,
    answer_token_ids,
    filter_correct,
    filter_single_token,
    number_tokens,
    resolve_bos,
    single_token_ranges,
    to_layouts,
)

__all__ += ["operand_space_size", "number_tokens", "single_token_ranges", "answer_form", "resolve_bos"]
