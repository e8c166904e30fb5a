"""Prompt datasets: one's own prompts and answers, from a JSON-lines or CSV file or a Hugging Face ``Dataset``.

Columns: ``prompt`` (the text before the answer, without BOS) and ``answer`` (the text the model should write
next, e.g. ``" Paris"``, or an integer); any further column is a *slot column*: the value of one slot the prompt
was made of (e.g. ``country``). Slot columns make layouts line up slot by slot (:func:`slot_layouts`: rows of one
token length are further split by the token positions each slot value takes, so CAMA's positions mean the same
slot in every row). A ``.jsonl`` file holds one JSON object a line, a ``.csv`` file a header row naming the columns
(CSV answers are text: ``12`` is the text ``"12"``, which is tokenised as the number would be).

:func:`prepare_dataset_prompts` treats the rows as the catalogue's prompts are treated (:mod:`circuits.prompts`):
shuffled with ``seed``, answers written as the tokenizer writes them after the prompt and kept when they are one
token (``numbers="single"``) or a clean continuation (``"multi"``, read under teacher forcing,
:mod:`circuits.tasks.digits`), BOS per ``prepend_bos``, rows grouped by token length, correctness checked with a
forward pass. The layout with most correct prompts is kept and its first ``n_prompts`` correct rows are scored.

**Fit set.** The means are fitted on the *other* rows of the same layout (every row of the file that is not
scored, correct or not for ``population="all"``, the correct ones for ``"correct"``), so the fit set is disjoint
from the scored prompts, as :mod:`circuits.prompts.fitset` requires. With CAMA every ``(position, token)`` entry a
scored prompt reads needs ``min_count`` fit rows holding that token there: a value that occurs in one row only cannot
be conditioned on, and its prompts are set aside (counted in ``Prompts.n_dropped_fit``). A file therefore needs
each varying token in several rows (e.g. a product of slot values, as a task file makes).

**A separate fit set** (``fit_source``: ``--fit-prompts`` / ``PromptSpec(fit_prompts=...)``): a few hundred prompts
of one's own hold each value too seldom to back CAMA's means. The means are then fitted on another prompt file
(the same columns; its rows in the scored prompts' layout, none of them a scored prompt) or on the first
``--fit-size`` prompts of a task file (``.toml`` / ``.json``: the task the rows were made of, its slots named as the
slot columns). Every row of ``--prompts`` may then be scored.

**Before a model loads**, :func:`dataset_prompt_lengths` counts each row's prompt in tokens with the model's tokenizer
alone (what ``af1 edges`` plans its memory from, :mod:`circuits.edges.plan`).
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

import numpy as np
import torch

from circuits.errors import ArgumentError, PromptError
from circuits.prompts.prompt_files import LINE, NOT_SLOTS, PROMPT_SUFFIXES, PromptData, prompts_label, read_prompts
from interventions.types import Model

if TYPE_CHECKING:
    from jaxtyping import Int

    from circuits.prompts.fitspec import FitSpec
    from circuits.prompts.sampling import Prompts
    from circuits.tasks.catalogue import TaskLike
    from circuits.tasks.formats import PromptFormat
    from circuits.tasks.tokens import Layout
    from datasets import Dataset
    from interventions.types import Tokenizer

__all__ = ["PROMPT_SUFFIXES", "chat_prompts", "dataset_prompt_lengths", "fit_from_task", "fit_source_label",
           "prompts_label", "prepare_dataset_prompts", "read_prompts"]

FIT_FLAGS = "give a fit set (--fit-prompts FILE.jsonl|csv, or --fit-prompts TASK.toml for the task's)"
"""How to give a prompt dataset's means more fit prompts, as the refusals say it."""


def prepare_dataset_prompts(model: Model, source: PromptData, n_prompts: int, seed: int = 0, *,
                            means: str | None = None, fit: FitSpec | None = None, prepend_bos: bool | None = None,
                            numbers: str = "single", fmt: PromptFormat | None = None, max_checked: int | None = None,
                            batch_size: int = 128, fit_source: TaskLike | PromptData | None = None) -> Prompts:
    """``n_prompts`` rows of ``source`` that ``model`` answers correctly, in one layout, as
    :class:`~circuits.prompts.Prompts` (``source="prompts"``), with the fit set of ``means`` (``"cama"``,
    ``"mean"``, ``"head"`` or ``None``; ``fit``: a :class:`~circuits.prompts.fitset.FitSpec`) drawn from the other rows
    (see the module docstring), or from ``fit_source`` when given (a prompt dataset, or a task whose first
    ``fit.size`` prompts in the order of ``fit.seed`` are drawn: :func:`fit_rows`). ``fmt``: a
    :class:`~circuits.tasks.formats.PromptFormat` (the chat template only: solved examples need a task). Raises
    :class:`~circuits.errors.PromptError` with one line when too few rows are usable."""
    from circuits.faithfulness import base_correct
    from circuits.prompts.fitset import FitSet, FitSpec, pick_covered
    from circuits.prompts.sampling import Prompts, filter_numbers
    from circuits.tasks import catalogue as tasks

    label = prompts_label(source)
    where = f"prompts file {label}" if isinstance(source, (str, Path)) else f"prompts {label}"
    ds = read_prompts(source)
    n_rows = len(ds)
    if fmt is not None and fmt.shots:
        raise ArgumentError("--shots draws solved examples from a task: with --prompts put them into the prompts")
    if fmt is not None and fmt.chat:
        prepend_bos = fmt.prepend_bos(prepend_bos)
        ds = _chat(ds, model)
    ds = ds.select(np.random.default_rng(seed).permutation(n_rows).tolist())
    kept, n_dropped = filter_numbers(ds, model, numbers)
    if not len(kept):
        what = "one token" if numbers == "single" else "a clean continuation of its prompt"
        raise PromptError(f"{where}: no row's answer is {what} for this tokenizer (column answer)"
                          + ("; answers of several tokens need --numbers multi" if numbers == "single" else ""))
    layouts = slot_layouts(tasks.to_layouts(model, kept, prepend_bos=prepend_bos), kept, model, where)
    budget = max_checked if max_checked is not None else n_rows
    correct_by: dict[Hashable, torch.Tensor] = {}
    n_checked = n_correct = 0
    for lay in layouts:
        take = min(len(lay), max(0, budget - n_checked))
        ok = torch.zeros(len(lay), dtype=torch.bool)
        if take:
            ok[:take] = base_correct(model, lay.tokens[:take], lay.answers[:take], batch_size=batch_size)
        correct_by[lay.key] = ok
        n_checked += take
        n_correct += int(ok.sum())
    if n_correct == 0:
        raise PromptError(f"{where}: the model answers none of the {n_checked} checked rows correctly "
                          f"(base accuracy 0%)")
    lay = max(layouts, key=lambda x: (int(correct_by[x.key].sum()), -x.n_pos))
    ok = correct_by[lay.key]
    spec = fit if fit is not None else FitSpec()
    pool = ok if spec.population == "correct" else torch.ones(len(lay), dtype=torch.bool)
    rows = ok.nonzero().flatten()
    min_count = spec.min_count if means == "cama" else 0
    own = fit_source if means is not None else None
    if own is not None:
        fit_tokens, n_fit_drawn = fit_rows(model, own, spec, ds, lay.key, numbers=numbers,
                                           prepend_bos=prepend_bos, fmt=fmt, batch_size=batch_size)
        picked, set_aside = pick_backed(lay.tokens[rows], fit_tokens, n_prompts, min_count)
    else:
        picked, set_aside = pick_covered(lay.tokens[rows], lay.tokens[pool], n_prompts, min_count)
    scored = rows[picked].tolist()
    if len(scored) < n_prompts:
        held = "fit rows" if own is not None else "other rows"
        why = (f"; {set_aside} read a (position, token) fewer than {spec.min_count} {held} hold: {FIT_FLAGS}, "
               f"or lower --fit-min-count" if set_aside else "")
        fewer = f"{'; or' if set_aside else ';'} lower --n-prompts to {len(scored)} or less" if scored else ""
        raise PromptError(f"{where}: {len(scored)} of {int(ok.sum())} correct rows usable ({lay.n_pos}-token layout), "
                          f"{n_prompts} needed{why}{fewer}")
    idx = torch.tensor(scored, dtype=torch.long)
    fit_set = None
    if own is not None:
        from interventions.coverage import row_digests

        fit_tokens = fit_tokens[~torch.isin(row_digests(fit_tokens), row_digests(lay.tokens[idx]))]
        fit_set = FitSet(tokens=fit_tokens, spec=spec, task=fit_source_label(own), whole=not fit_from_task(own),
                         n_drawn=n_fit_drawn)
    elif means is not None:
        from interventions.coverage import row_digests

        fit_mask = pool.clone()
        fit_mask[idx] = False
        cand = lay.tokens[fit_mask]
        cand = cand[~torch.isin(row_digests(cand), row_digests(lay.tokens[idx]))]
        fit_set = FitSet(tokens=cand, spec=spec, task=label, whole=True, n_drawn=n_rows)
    pick = idx.tolist()
    return Prompts(
        tokens=lay.tokens[idx], answers=lay.answers[idx], prompts=[lay.prompts[i] for i in pick],
        answer_values=[lay.answer_values[i] for i in pick], base_accuracy=n_correct / n_checked,
        n_checked=n_checked, n_correct=n_correct, task=label, source="prompts", seed=int(seed),
        n_layouts=len(layouts), n_dropped_multi_token=int(n_dropped), n_drawn=n_rows,
        n_wrong=n_checked - n_correct, prepend_bos=lay.bos is not None, bos_token=lay.bos,
        answer_texts=None if lay.answer_texts is None else [lay.answer_texts[i] for i in pick],
        stop="exhausted" if len(scored) < n_prompts else "found", fit=fit_set, n_dropped_fit=set_aside,
        numbers=numbers, layout=lay.key, fmt=fmt)


def fit_from_task(source: TaskLike | PromptData) -> TypeGuard[TaskLike]:
    """Whether a fit source (``PromptSpec.fit_prompts``) names a task (a :class:`~circuits.tasks.TaskSpec`, a
    ``.toml`` / ``.json`` task file, a catalogue name) rather than a prompt dataset (a ``.jsonl`` / ``.csv`` file, a
    ``Dataset``)."""
    from circuits.tasks import catalogue as tasks

    if isinstance(source, tasks.TaskSpec):
        return True
    if not isinstance(source, (str, Path)) or str(source).lower().endswith(PROMPT_SUFFIXES):
        return False
    return tasks.task_path(str(source)) is not None or str(source) in tasks.list_tasks()


def fit_source_label(source: TaskLike | PromptData) -> str:
    """How runs name a fit source: a task's label (:func:`circuits.tasks.task_label`), else the dataset's."""
    from circuits.tasks import catalogue as tasks

    if fit_from_task(source):
        return tasks.task_label(source)
    assert not isinstance(source, tasks.TaskSpec)  # a TaskSpec is a task
    return prompts_label(source)


def _task_dataset(source: TaskLike, spec: FitSpec, slots: list[str], where: str) -> Dataset:
    """The first ``spec.size`` prompts of the task ``source`` in the order of ``spec.seed`` as prompt rows, with a
    column per slot in ``slots`` (the scored dataset's slot columns, each a slot of the task)."""
    from circuits.tasks import catalogue as tasks
    from datasets import Dataset

    task = tasks.get_task(source)
    missing = [c for c in slots if c not in task.operand_names]
    if missing:
        raise ArgumentError(f"--fit-prompts {tasks.task_label(source)}: the task has no slot {missing[0]!r}, a slot "
                            f"column of {where}; name the slot columns as the task's slots "
                            f"({', '.join(task.operand_names)})")
    ds = tasks.build_task(task, n=spec.size, seed=spec.seed)
    cols: dict[str, list[object]] = {"prompt": list(ds["prompt"]), "answer": list(ds["answer"])}
    if "answer_text" in ds.column_names:
        cols["answer_text"] = list(ds["answer_text"])
    operands = list(ds["operands"])
    for c in slots:
        i = task.operand_names.index(c)
        cols[c] = [task.value(i, ops[i]) for ops in operands]
    return Dataset.from_dict({**cols, LINE: [f"prompt {i}" for i in range(len(ds))]})


def fit_rows(model: Model, source: TaskLike | PromptData, spec: FitSpec, scored: Dataset, key: Hashable, *,
             numbers: str, prepend_bos: bool | None, fmt: PromptFormat | None, batch_size: int
             ) -> tuple[Int[torch.Tensor, "n pos"], int]:
    """``(tokens, rows drawn)``: the fit prompts of ``source`` (a prompt dataset, or a task: :func:`fit_from_task`)
    in the scored prompts' layout ``key`` (their token length and, with slot columns, where each slot sits; the
    slot columns of ``scored``, the scored dataset, are the ones compared), BOS per ``prepend_bos``, only those the
    model answers correctly for ``spec.population == "correct"``."""
    from circuits.faithfulness import base_correct
    from circuits.prompts.sampling import filter_numbers
    from circuits.tasks import catalogue as tasks

    slots = [c for c in scored.column_names if c not in NOT_SLOTS]
    label = fit_source_label(source)
    where = f"--fit-prompts {label}"
    if fit_from_task(source):
        ds = _task_dataset(source, spec, slots, "--prompts")
    else:
        assert not isinstance(source, tasks.TaskSpec)  # a TaskSpec is a task
        ds = read_prompts(source)
        missing = [c for c in slots if c not in ds.column_names]
        if missing:
            raise ArgumentError(f"{where}: column {missing[0]}: missing; the fit prompts need the slot columns of "
                                f"--prompts ({', '.join(slots)})")
        ds = ds.select_columns([c for c in ds.column_names if c in NOT_SLOTS] + slots)
    n_drawn = len(ds)
    if fmt is not None and fmt.chat:
        ds = _chat(ds, model)
    kept, _ = filter_numbers(ds, model, numbers)
    lay = None
    if len(kept):
        lay = next((x for x in slot_layouts(tasks.to_layouts(model, kept, prepend_bos=prepend_bos), kept, model,
                                            where) if x.key == key), None)
    if lay is None:
        raise PromptError(f"{where}: none of its {n_drawn} prompts has the form of the scored prompts (their token "
                          f"length{' and slot positions' if slots else ''}); "
                          f"give fit prompts written as the scored ones")
    tokens = lay.tokens
    if spec.population == "correct":
        tokens = tokens[base_correct(model, tokens, lay.answers, batch_size=batch_size)]
    return tokens, n_drawn


def pick_backed(candidates: Int[torch.Tensor, "m pos"], fit: Int[torch.Tensor, "f pos"], n: int, min_count: int
                ) -> tuple[list[int], int]:
    """``(picked, set aside)``: the first ``n`` rows of ``candidates`` (``[m, pos]``) whose every ``(position,
    token)`` entry (positions ``>= 1``) at least ``min_count`` rows of the separate fit set ``fit`` hold once the
    picked rows are taken out of it (a candidate may also be a fit row); ``set aside``: candidates passed over
    before the ``n``-th was found."""
    from collections import Counter

    from interventions.coverage import row_digests

    counts: Counter = Counter()
    for row in fit[:, 1:].tolist():
        counts.update(enumerate(row))
    in_fit = set(row_digests(fit).tolist()) if len(fit) else set()
    picked: list[int] = []
    aside = 0
    for i, (row, digest) in enumerate(zip(candidates[:, 1:].tolist(), row_digests(candidates).tolist())):
        if len(picked) == n:
            break
        entries = list(enumerate(row))
        taken = 1 if digest in in_fit else 0
        if min_count and any(counts[e] - taken < min_count for e in entries):
            aside += 1
            continue
        if taken:
            counts.subtract(entries)
        picked.append(i)
    return picked, aside


def slot_layouts(layouts: list[Layout], ds: Dataset, model: Model, where: str) -> list[Layout]:
    """``layouts`` (of ``ds``'s rows) split so that every slot column's value (a column besides :data:`NOT_SLOTS`)
    sits at the same token positions in all rows of one layout, largest first; ``layouts`` itself without slot
    columns. A value is found in its prompt as text (an integer as a whole number); one that does not occur is a
    one-line :class:`~circuits.errors.ArgumentError` naming the row and the column (after ``where``, e.g.
    ``"prompts file my.jsonl"``)."""
    import re

    from circuits.tasks.tokens import Layout, encode_texts, tokenizer_of

    slots = [c for c in ds.column_names if c not in NOT_SLOTS]
    if not slots:
        return layouts
    values = {c: list(ds[c]) for c in slots}
    lines = list(ds[LINE]) if LINE in ds.column_names else [f"row {i}" for i in range(len(ds))]
    tok = tokenizer_of(model)
    out = []
    for lay in layouts:
        keys: list[tuple[tuple[int, int], ...]] = []
        for prompt, offs, i in zip(lay.prompts, encode_texts(tok, lay.prompts, offsets=True)["offset_mapping"],
                                   lay.indices):
            key: list[tuple[int, int]] = []
            taken: list[tuple[int, int]] = []
            for c in slots:
                v = values[c][i]
                pattern = (rf"(?<!\d){int(v)}(?!\d)" if isinstance(v, int) and not isinstance(v, bool)
                           else re.escape(str(v)))
                spans = [m.span() for m in re.finditer(pattern, prompt)]
                free = [(a, b) for a, b in spans if not any(a < y and b > x for x, y in taken)]
                if not spans:
                    raise ArgumentError(f"{where}: {lines[i]}: column {c}: {v!r} does not occur in the prompt "
                                        f"(a column besides prompt and answer holds a value the prompt was made of)")
                a, b = (free or spans)[0]  # the first occurrence an earlier slot has not claimed
                taken.append((a, b))
                hit = [k for k, (s, e) in enumerate(offs) if s < b and e > a]
                key.append((hit[0], hit[-1]) if hit else (-1, -1))
            keys.append(tuple(key))
        for layout_key in dict.fromkeys(keys):
            idx = [j for j, k in enumerate(keys) if k == layout_key]
            out.append(Layout(tokens=lay.tokens[idx], answers=lay.answers[idx], prompts=[lay.prompts[j] for j in idx],
                              answer_values=[lay.answer_values[j] for j in idx], indices=[lay.indices[j] for j in idx],
                              answer_texts=None if lay.answer_texts is None else [lay.answer_texts[j] for j in idx],
                              bos=lay.bos, key=(lay.key, layout_key)))
    return sorted(out, key=lambda x: (-len(x), x.n_pos))


def _chat(ds: Dataset, model: Model) -> Dataset:
    """``ds`` with each prompt in the tokenizer's chat template (the user's message, the assistant's turn open)."""
    return ds.remove_columns(["prompt"]).add_column("prompt", chat_prompts(list(ds["prompt"]), model))


def chat_prompts(prompts: list[str], model_or_tokenizer: Model | Tokenizer) -> list[str]:
    """Each of ``prompts`` in the chat template of a model's tokenizer (or of a tokenizer itself): the user's
    message, the assistant's turn open."""
    from circuits.tasks.tokens import tokenizer_of

    tok = tokenizer_of(model_or_tokenizer)
    if getattr(tok, "chat_template", None) is None:
        raise ArgumentError("--chat: this model's tokenizer has no chat template; drop --chat")
    return [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


def dataset_prompt_lengths(source: str | Path | Dataset, tokenizer: Tokenizer, fmt: PromptFormat | None = None,
                           prepend_bos: bool | None = None) -> list[int]:
    """Tokens of the prompt of every row of the prompt dataset ``source`` (a ``.jsonl`` / ``.csv`` path or a
    ``Dataset``, read and checked by :func:`read_prompts`) as a run tokenises it with ``tokenizer``, without a
    model: in the chat template when ``fmt`` asks for it, BOS counted unless ``prepend_bos`` (after
    :meth:`~circuits.tasks.formats.PromptFormat.prepend_bos`) is ``False`` (the loaders' default is BOS). The
    first tokens of a teacher-forced answer (``--numbers multi``) are not counted. Units: tokens; one per row, in
    the file's order."""
    from circuits.tasks.tokens import encode_texts

    prompts = list(read_prompts(source)["prompt"])
    if fmt is not None and fmt.chat:
        prepend_bos = fmt.prepend_bos(prepend_bos)
        prompts = chat_prompts(prompts, tokenizer)
    bos = 0 if prepend_bos is False else 1
    return [bos + len(ids) for ids in encode_texts(tokenizer, prompts)["input_ids"]]
