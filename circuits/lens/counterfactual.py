"""Counterfactual prompts for the interchange check: one operand or one operator symbol changed.

The arithmetic (answers, prompt texts) is the task's own: :class:`circuits.tasks.TaskSpec` ``answers``,
``answer`` and ``prompt``. An operator flip is the same task with the ``index``-th ``+``/``-`` of its
template and expression flipped. Pairs are kept for :func:`circuits.lens.interchange` only when both
prompts have the same token layout and both answers are single tokens (:func:`counterfactual_set`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from jaxtyping import Int

from circuits.errors import ArgumentError, PromptError
from circuits.tasks import catalogue as tasks
from circuits.tasks.catalogue import TaskSpec
from interventions.types import JsonDict, JsonMapping, Model

from .inputs import answer_token_id

__all__ = ["parse_operands", "counterfactual_rows", "CounterfactualSet", "counterfactual_set"]

_SPEC_FIELDS = ("template", "expression", "operand_names", "operand_ranges", "answer_min", "answer_max")


def _as_task_spec(spec: Any) -> TaskSpec:
    """``spec`` itself if it is a :class:`TaskSpec`, else a TaskSpec holding its ``_SPEC_FIELDS``."""
    if isinstance(spec, TaskSpec):
        return spec
    fields = {k: getattr(spec, k) for k in _SPEC_FIELDS}
    fields["operand_names"] = tuple(fields["operand_names"])
    fields["operand_ranges"] = tuple(tuple(r) for r in fields["operand_ranges"])
    return TaskSpec(name=str(getattr(spec, "name", "")), default_n=0, group="", style="", card="", **fields)


def _flip_operator(spec: TaskSpec, index: int) -> TaskSpec:
    """``spec`` with the ``index``-th ``+``/``-`` of its template (outside placeholders) and of its
    expression flipped."""
    def flip_nth(text: str, skip_braces: bool) -> str | None:
        count, depth = 0, 0
        for i, ch in enumerate(text):
            if skip_braces and ch == "{":
                depth += 1
            elif skip_braces and ch == "}":
                depth -= 1
            elif depth == 0 and ch in "+-":
                if count == index:
                    return text[:i] + ("-" if ch == "+" else "+") + text[i + 1:]
                count += 1
        return None

    t, e = flip_nth(spec.template, True), flip_nth(spec.expression, False)
    if t is None or e is None:
        raise ArgumentError(
            f"cannot flip operator {index}: template {spec.template!r} / expression {spec.expression!r} has "
            f"no operator symbol at that index (only templates with '+'/'-' symbols can be flipped)"
        )
    return dataclasses.replace(spec, template=t, expression=e)


def parse_operands(template: str, operand_names: Sequence[str], prompt: str) -> list[int] | None:
    """Operands of ``prompt`` read back through ``template`` (e.g. ``"{A}+{B}="``), in
    ``operand_names`` order; None if the prompt does not match the template."""
    pattern, pos = "", 0
    for m in re.finditer(r"\{([A-Za-z_]\w*)\}", template):
        pattern += re.escape(template[pos:m.start()]) + f"(?P<{m.group(1)}>-?[0-9]+)"
        pos = m.end()
    match = re.fullmatch(pattern + re.escape(template[pos:]), prompt)
    if match is None:
        return None
    return [int(match.group(n)) for n in operand_names]


ENUMERATED_VALUES = 100_000
"""An operand range of at most this many values is enumerated (every other value a candidate); a larger one
(a task file's slot over 0..10^9, say) is sampled: :data:`SAMPLED_VALUES` draws, in bounded time and memory."""
SAMPLED_VALUES = 1_000
"""Values drawn per row (same number of digits first, then the whole range) where a range is sampled."""


def _operand_candidates(spec: TaskSpec, ops: list[int], index: int,
                        values: np.ndarray | None = None) -> list[tuple[int, list[int], int]]:
    """Every ``(value, operands, answer)`` with operand ``index`` set to another value of its range (or of
    ``values``) and the answer within ``[answer_min, answer_max]``, in the order of the values."""
    if values is None:
        lo, hi = spec.operand_ranges[index]
        values = np.arange(int(lo), int(hi) + 1, dtype=np.int64)
    values = values[values != ops[index]]
    grid = np.tile(np.asarray(ops, dtype=np.int64), (len(values), 1))
    grid[:, index] = values
    ans = spec.answers(grid)
    keep = (ans >= spec.answer_min) & (ans <= spec.answer_max)
    return [(int(v), [int(x) for x in row], int(a)) for v, row, a in zip(values[keep], grid[keep], ans[keep])]


def same_digit_bounds(value: int) -> tuple[int, int]:
    """The integers written with as many characters as ``value`` (sign included): ``(lo, hi)``, inclusive."""
    width = len(str(value))
    if value >= 0:
        return (0 if width == 1 else 10 ** (width - 1)), 10 ** width - 1
    digits = width - 1
    return -(10 ** digits - 1), (-1 if digits == 1 else -(10 ** (digits - 1)))


def _pick_operand(spec: TaskSpec, ops: list[int], index: int,
                  rng: np.random.Generator) -> tuple[list[int], int] | None:
    """``(operands, answer)`` with operand ``index`` changed, drawn with ``rng``; a value with the same number
    of digits where one qualifies; ``None`` if no value does."""
    lo, hi = (int(x) for x in spec.operand_ranges[index])
    if hi - lo < ENUMERATED_VALUES:
        cands = _operand_candidates(spec, ops, index)
        same = [c for c in cands if len(str(c[0])) == len(str(ops[index]))]
        pool = same or cands
        if not pool:
            return None
        _, new, a = pool[int(rng.integers(len(pool)))]
        return new, a
    s_lo, s_hi = same_digit_bounds(ops[index])
    for a, b in ((max(lo, s_lo), min(hi, s_hi)), (lo, hi)):
        if a <= b:
            drawn = rng.integers(a, b, size=SAMPLED_VALUES, dtype=np.int64, endpoint=True)
            cands = _operand_candidates(spec, ops, index, drawn)
            if cands:
                return cands[0][1], cands[0][2]
    return None


def counterfactual_rows(
    ds: Any, *, change: str = "operand", index: int = 0, seed: int = 0, spec: Any = None
) -> list[JsonDict]:
    """Counterfactual prompt texts for a task dataset (columns ``prompt``, ``answer``, ``operands``,
    ``task``), one per row that admits one.

    ``change="operand"``: operand ``index`` (task order A, B, C; 0-indexed) is replaced by another value
    of its range, drawn with ``numpy.random.default_rng(seed)``, preferring values with the same number
    of digits (so the layout usually stays the same); the new answer must lie in the task's answer range.
    A range of more than :data:`ENUMERATED_VALUES` values is sampled (:data:`SAMPLED_VALUES` draws per row),
    so that time and memory stay bounded; a row none of whose draws qualifies is dropped.
    ``change="operator"``: the ``index``-th ``+``/``-`` symbol of the template is flipped; rows whose new
    answer is negative or above the task's maximum are dropped.

    ``spec`` (a ``tasks.TaskSpec``, or any object with its fields template, expression, operand_names,
    operand_ranges, answer_min, answer_max) defaults to ``tasks.get_task(row["task"])``. Returns dicts
    with ``prompt``, ``answer``, ``operands``, ``counter_prompt``, ``counter_answer``,
    ``counter_operands``, ``row`` (input index).
    """
    if change not in ("operand", "operator"):
        raise ArgumentError(f"change={change!r} is not valid: choose 'operand' or 'operator'")
    rows = ds.to_list() if hasattr(ds, "to_list") else list(ds)
    rng = np.random.default_rng(seed)
    given = None if spec is None else _as_task_spec(spec)
    specs: dict[str, TaskSpec] = {}
    out = []
    for i, r in enumerate(rows):
        sp = given
        if sp is None:
            if r["task"] not in specs:
                specs[r["task"]] = tasks.get_task(r["task"])
            sp = specs[r["task"]]
        ops = [int(x) for x in r["operands"]]
        pair = {"prompt": r["prompt"], "answer": int(r["answer"]), "operands": ops}
        if change == "operand":
            if not 0 <= index < len(ops):
                raise ArgumentError(f"index={index} is out of range: the task has operands 0..{len(ops) - 1}")
            picked = _pick_operand(sp, ops, index, rng)
            if picked is None:
                continue
            new, a = picked
            out.append({**pair, "counter_prompt": sp.prompt(new), "counter_answer": a,
                        "counter_operands": new, "row": i})
        else:
            flipped = _flip_operator(sp, index)
            a = cast(int, flipped.answer(ops))  # operators are flipped in arithmetic tasks only: an int
            if not 0 <= a <= sp.answer_max:
                continue
            out.append({**pair, "counter_prompt": flipped.prompt(ops), "counter_answer": a,
                        "counter_operands": ops, "row": i})
    return out


@dataclass
class CounterfactualSet:
    """Pairs of prompts of one layout for :func:`circuits.lens.interchange` (tokens with BOS at
    position 0; answers are token ids)."""

    tokens: Int[torch.Tensor, "batch pos"]
    answers: Int[torch.Tensor, " batch"]
    counter_tokens: Int[torch.Tensor, "batch pos"]
    counter_answers: Int[torch.Tensor, " batch"]
    prompts: list[str]
    counter_prompts: list[str]
    n_dropped: int
    label: str = ""


def counterfactual_set(model: Model, pairs: Iterable[JsonMapping], *, label: str = "") -> CounterfactualSet:
    """Tokenise counterfactual pairs (:func:`counterfactual_rows`) and keep only same-layout pairs:
    both prompts have the same token length, both answers are single tokens, and the pair belongs to the
    most common layout (ties: the shorter). ``n_dropped`` counts the rest. ``ValueError`` if no pair is
    left."""
    kept: dict[int, list[tuple]] = {}
    n_in = 0
    for p in pairs:
        n_in += 1
        a = model.to_tokens(p["prompt"])[0].cpu()
        b = model.to_tokens(p["counter_prompt"])[0].cpu()
        if a.numel() != b.numel():
            continue
        try:
            ai, bi = answer_token_id(model, p["answer"]), answer_token_id(model, p["counter_answer"])
        except ValueError:
            continue
        kept.setdefault(a.numel(), []).append((a, b, ai, bi, p["prompt"], p["counter_prompt"]))
    if not kept:
        raise PromptError(f"no counterfactual pair of the same layout among {n_in} pairs ({label or 'unnamed'})")
    _, items = max(kept.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    return CounterfactualSet(
        tokens=torch.stack([x[0] for x in items]), answers=torch.tensor([x[2] for x in items]),
        counter_tokens=torch.stack([x[1] for x in items]), counter_answers=torch.tensor([x[3] for x in items]),
        prompts=[x[4] for x in items], counter_prompts=[x[5] for x in items], n_dropped=n_in - len(items),
        label=label,
    )
