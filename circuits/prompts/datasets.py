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
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from circuits.errors import ArgumentError, PromptError
from circuits.tasks.package_data import find_file

__all__ = ["PROMPT_SUFFIXES", "prompts_label", "prepare_dataset_prompts", "read_prompts"]

PROMPT_SUFFIXES = (".jsonl", ".csv")
"""File types ``--prompts`` reads."""
LINE = "_line"
"""The column :func:`read_prompts` adds: where each row came from (``"line 3"`` of a file, ``"row 2"`` of a Dataset)."""
NOT_SLOTS = ("prompt", "answer", "answer_text", "answer_ids", "layout", "operands", "task", LINE)
"""Columns that are not slot values."""


def prompts_label(source: Any) -> str:
    """How runs name a prompt dataset: the file path, or ``dataset:<fingerprint>`` for a ``Dataset``."""
    if isinstance(source, (str, Path)):
        return str(source)
    return f"dataset:{getattr(source, '_fingerprint', None) or len(source)}"


def read_prompts(source: Any) -> Any:
    """The rows of ``source`` (a ``.jsonl`` / ``.csv`` path or a ``datasets.Dataset``) as a ``Dataset``, checked:
    one-line :class:`~circuits.errors.ArgumentError` naming the file, the line and the column otherwise."""
    from datasets import Dataset

    if not isinstance(source, (str, Path)):
        columns = getattr(source, "column_names", None)
        if columns is None:
            raise ArgumentError(f"prompts: {type(source).__name__} is neither a .jsonl/.csv path nor a Dataset")
        cols = _checked({c: list(source[c]) for c in columns if c != LINE}, "prompts dataset", lambda i: f"row {i}")
        return Dataset.from_dict({**cols, LINE: [f"row {i}" for i in range(len(cols["prompt"]))]})
    path = find_file(source)  # as --task finds a file: here, else the shipped examples (examples/capital.jsonl)
    if path.suffix.lower() not in PROMPT_SUFFIXES:
        raise ArgumentError(f"prompts file {path}: give a .jsonl or .csv file (columns prompt, answer)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ArgumentError(f"prompts file {path} cannot be read: {err.strerror or err}") from None
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        rows = list(reader)
        lines = list(range(2, len(rows) + 2))  # line 1 is the header
        names = reader.fieldnames or []
    else:
        rows, lines = [], []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ArgumentError(f"prompts file {path}: line {n}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ArgumentError(f"prompts file {path}: line {n}: must be a JSON object with prompt and answer")
            rows.append(row)
            lines.append(n)
        names = list(dict.fromkeys(k for r in rows for k in r))
    if not rows:
        raise ArgumentError(f"prompts file {path} has no rows: give one prompt and answer a line")
    for n, row in zip(lines, rows):
        missing = [k for k in names if k not in row]
        if missing:
            raise ArgumentError(f"prompts file {path}: line {n}: column {missing[0]}: missing (every row needs the "
                                f"same columns)")
    cols = {k: [r[k] for r in rows] for k in names if k != LINE}
    cols = _checked(cols, f"prompts file {path}", lambda i: f"line {lines[i]}")
    return Dataset.from_dict({**cols, LINE: [f"line {n}" for n in lines]})


def _checked(cols: dict[str, list[Any]], where: str, line: Any) -> dict[str, list[Any]]:
    for key in ("prompt", "answer"):
        if key not in cols:
            raise ArgumentError(f"{where}: column {key}: missing (columns prompt and answer are needed)")
    for i, (p, a) in enumerate(zip(cols["prompt"], cols["answer"])):
        if not isinstance(p, str) or not p:
            raise ArgumentError(f"{where}: {line(i)}: column prompt: {p!r} is not a non-empty string")
        if isinstance(a, bool) or not isinstance(a, (str, int)) or a == "":
            raise ArgumentError(f"{where}: {line(i)}: column answer: {a!r} is not a non-empty string or an integer")
    if "answer_text" in cols and any(not isinstance(t, str) or not t for t in cols["answer_text"]):
        i = next(i for i, t in enumerate(cols["answer_text"]) if not isinstance(t, str) or not t)
        raise ArgumentError(f"{where}: {line(i)}: column answer_text: not a non-empty string")
    for key, column in cols.items():  # one type a column: mixed integers and text become text
        if len({type(v) for v in column}) > 1:
            cols[key] = [v if isinstance(v, str) else json.dumps(v) for v in column]
    return cols


def prepare_dataset_prompts(model: Any, source: Any, n_prompts: int, seed: int = 0, *, means: str | None = None,
                            fit: Any = None, prepend_bos: bool | None = None, numbers: str = "single",
                            fmt: Any = None, max_checked: int | None = None, batch_size: int = 128) -> Any:
    """``n_prompts`` rows of ``source`` that ``model`` answers correctly, in one layout, as
    :class:`~circuits.prompts.Prompts` (``source="prompts"``), with the fit set of ``means`` (``"cama"``,
    ``"mean"``, ``"head"`` or ``None``; ``fit``: a :class:`~circuits.prompts.fitset.FitSpec`) drawn from the other rows
    (see the module docstring). ``fmt``: a :class:`~circuits.tasks.formats.PromptFormat` (the chat template only:
    solved examples need a task). Raises :class:`~circuits.errors.PromptError` with one line when too few rows
    are usable."""
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
    correct_by: dict[Any, torch.Tensor] = {}
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
    picked, set_aside = pick_covered(lay.tokens[rows], lay.tokens[pool], n_prompts,
                                     spec.min_count if means == "cama" else 0)
    scored = rows[picked].tolist()
    if len(scored) < n_prompts:
        why = (f"; {set_aside} more read a (position, token) entry that fewer than {spec.min_count} other rows "
               f"hold (CAMA needs each varying token in several rows: add rows, or lower --fit-min-count)"
               if set_aside else "")
        raise PromptError(f"{where}: {len(scored)} usable correct rows in the largest layout "
                          f"({lay.n_pos} tokens) of {int(ok.sum())} correct, {n_prompts} needed{why}; lower "
                          f"--n-prompts to {len(scored)} or less")
    idx = torch.tensor(scored, dtype=torch.long)
    fit_rows = pool.clone()
    fit_rows[idx] = False
    fit_set = None
    if means is not None:
        from interventions.coverage import row_digests

        cand = lay.tokens[fit_rows]
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


def slot_layouts(layouts: list[Any], ds: Any, model: Any, where: str) -> list[Any]:
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


def _chat(ds: Any, model: Any) -> Any:
    """``ds`` with each prompt in the tokenizer's chat template (the user's message, the assistant's turn open)."""
    from circuits.tasks.tokens import tokenizer_of

    tok = tokenizer_of(model)
    if getattr(tok, "chat_template", None) is None:
        raise ArgumentError("--chat: this model's tokenizer has no chat template; drop --chat")
    wrapped = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
               for p in ds["prompt"]]
    return ds.remove_columns(["prompt"]).add_column("prompt", wrapped)
