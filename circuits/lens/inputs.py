"""Inputs of early decoding: prompts grouped by layout with their answer token ids and values.

A layout is one token length (BOS at position 0, last prompt token at position -1, no padding), so
every forward pass reads the same position ``-1`` for every prompt. Tokens given directly must be one
layout; a dataset is grouped by layout (largest first).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int

from circuits.errors import ArgumentError, PromptError
from circuits.tasks import catalogue as tasks
from interventions.types import JsonMapping, Model
from interventions.validation import check_tokens

from .numeric import NumericTable

__all__ = ["PromptGroup", "answer_token_id", "prompt_groups"]


@dataclass
class PromptGroup:
    """Prompts of one layout (the fields of :class:`circuits.tasks.Layout`, with float answer values).

    ``tokens``: ``[n, pos]`` token ids with BOS at position 0; ``answers``: ``[n]`` answer token ids;
    ``prompts``: prompt texts (without BOS); ``answer_values``: integer answers as floats (NaN where
    unknown); ``indices``: rows of the input, in this group's order.
    """

    tokens: Int[torch.Tensor, "n pos"]
    answers: Int[torch.Tensor, " n"]
    prompts: list[str]
    answer_values: list[float]
    indices: list[int]


def answer_token_id(model: Model, answer: object) -> int:
    """The single token id of ``answer`` (text or integer) as it follows the prompt; ``ValueError``
    naming the answer and its pieces when it is several tokens."""
    toks = model.to_tokens(str(answer), prepend_bos=False)[0]
    if toks.numel() != 1:
        pieces = [model.to_string(t[None]) for t in toks]
        raise PromptError(
            f"answer {answer!r} is not a single token: it splits into {toks.numel()} pieces {pieces}; "
            f"early decoding reads one next token, drop such prompts (e.g. tasks.filter_single_token)"
        )
    return int(toks[0])


def prompt_groups(
    model: Model,
    dataset_or_tokens: Any,
    *,
    table: NumericTable,
    answers: Any = None,
    answer_values: Sequence[float] | None = None,
    prompts: Sequence[str] | None = None,
) -> list[PromptGroup]:
    """The prompts of ``dataset_or_tokens`` as groups of one layout each (inputs of
    :func:`circuits.lens.early_decode`, which documents the arguments).

    A dataset (``datasets.Dataset`` or list of dicts with ``prompt`` and ``answer``) gives one group per
    layout, largest first (ties: shorter first); ``answers`` must then be None. Tokens (``[batch, pos]``,
    a list of equally long 1-D tensors, or a list of prompt texts) give one group and need ``answers``;
    ``answer_values`` default to the numeric value of each answer token in ``table`` (NaN if none).
    ``ValueError`` on mixed layouts, multi-token answers or lengths that do not match.
    """
    if _is_dataset(dataset_or_tokens):
        if answers is not None:
            raise ArgumentError("answers come from the dataset's 'answer' column: do not pass answers too")
        return _dataset_groups(model, dataset_or_tokens)
    obj = dataset_or_tokens
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], torch.Tensor):
        obj = _stack_one_layout(obj)
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], str):
        obj = _stack_one_layout([model.to_tokens(p)[0] for p in obj])
    tokens = check_tokens(obj, d_vocab=int(model.cfg.d_vocab)).cpu()
    if answers is None:
        raise ArgumentError("answers are required with a tokens input (one answer per prompt)")
    ids = _answer_ids(model, answers, tokens.shape[0])
    if prompts is None:
        prompts = _to_strings(model, tokens)
    elif len(prompts) != tokens.shape[0]:
        raise ArgumentError(f"prompts has {len(prompts)} entries for {tokens.shape[0]} prompts")
    if answer_values is None:
        vals = [float(v) if (v := table.value(int(a))) is not None else float("nan") for a in ids]
    else:
        vals = [float(v) for v in answer_values]
        if len(vals) != tokens.shape[0]:
            raise ArgumentError(f"answer_values has {len(vals)} entries for {tokens.shape[0]} prompts")
    return [PromptGroup(tokens, ids, list(prompts), vals, list(range(tokens.shape[0])))]


def _answer_ids(model: Model, answers: Any, n: int) -> torch.Tensor:
    if isinstance(answers, torch.Tensor):
        ids = answers.long().flatten().cpu()
    else:
        ids = torch.tensor([answer_token_id(model, a) for a in answers], dtype=torch.long)
    if ids.shape != (n,):
        raise ArgumentError(f"answers must hold one answer per prompt: got {ids.numel()} for {n} prompts")
    d_vocab = int(model.cfg.d_vocab)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= d_vocab):
        raise ArgumentError(f"answer token id out of range: valid ids are 0..{d_vocab - 1}")
    return ids


def _stack_one_layout(items: Sequence[torch.Tensor]) -> torch.Tensor:
    lengths = sorted({int(t.numel()) for t in items})
    if len(lengths) > 1:
        raise PromptError(
            f"prompts of mixed layout: token lengths {lengths}; tokens must be one layout (one length, no "
            f"padding). Pass a dataset (grouped by layout) or split the prompts by length"
        )
    return torch.stack([t.flatten().long() for t in items])


def _to_strings(model: Model, tokens: torch.Tensor) -> list[str]:
    if getattr(model, "tokenizer", None) is None:
        return [" ".join(str(int(t)) for t in row[1:]) for row in tokens]
    return [model.to_string(row[1:]) for row in tokens]


def _is_dataset(obj: object) -> bool:
    if hasattr(obj, "column_names"):
        return True
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and isinstance(obj[0], Mapping)


def _dataset_groups(model: Model, ds: Any) -> list[PromptGroup]:
    """Group a dataset (columns ``prompt`` and ``answer``) by layout, largest layout first.

    A ``datasets.Dataset`` goes through :func:`circuits.tasks.to_layouts`; a list of dicts is grouped
    here by the same rule, its answers tokenised with :func:`answer_token_id`."""
    if hasattr(ds, "column_names"):
        for a in sorted(set(ds["answer"]), key=str):
            answer_token_id(model, a)  # clear multi-token error before grouping
        return [PromptGroup(lay.tokens, torch.as_tensor(lay.answers).long(), list(lay.prompts),
                            [_as_value(x) for x in lay.answer_values], list(lay.indices))
                for lay in tasks.to_layouts(model, ds)]
    by_len: dict[int, list[tuple[int, torch.Tensor, int, JsonMapping]]] = {}
    for i, r in enumerate(ds):
        toks = model.to_tokens(r["prompt"])[0].cpu()
        aid = answer_token_id(model, r["answer"])
        by_len.setdefault(toks.numel(), []).append((i, toks, aid, r))
    groups = []
    for _, items in sorted(by_len.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        groups.append(PromptGroup(
            torch.stack([t for _, t, _, _ in items]), torch.tensor([a for _, _, a, _ in items]),
            [r["prompt"] for *_, r in items], [_as_value(r["answer"]) for *_, r in items],
            [i for i, *_ in items],
        ))
    return groups


def _as_value(x: object) -> float:
    try:
        return float(int(str(x).strip()))
    except ValueError:
        return float("nan")
