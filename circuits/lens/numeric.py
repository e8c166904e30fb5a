"""Numeric-token table: which vocabulary ids are integers (and their values) and which are operators.

A token is numeric when its stripped text matches ``-?[0-9]+``; an operator token's stripped text is
``+`` or ``-`` (:data:`OPERATOR_TEXTS`). The table is built once per model and shared by every
early-decoding metric that looks at numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Int

from circuits.errors import ArgumentError
from interventions.types import Model

__all__ = ["OPERATOR_TEXTS", "NumericTable", "numeric_table"]

OPERATOR_TEXTS = ("+", "-")
_INT_RE = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class NumericTable:
    """Which vocabulary ids are numbers (and their integer values) and which are operators.

    ``mask[i]`` is True when token ``i``'s stripped text is an integer; ``values[i]`` is that integer
    (0 elsewhere); ``operators`` maps operator token ids to their text (``"+"`` / ``"-"``).
    """

    mask: Bool[torch.Tensor, " d_vocab"]
    values: Int[torch.Tensor, " d_vocab"]
    operators: dict[int, str] = field(default_factory=dict)

    @property
    def n_numeric(self) -> int:
        return int(self.mask.sum())

    def value(self, token_id: int) -> int | None:
        """Integer value of ``token_id``, or None if it is not numeric."""
        return int(self.values[token_id]) if bool(self.mask[token_id]) else None


def _table_from_strings(strings: Sequence[str | None], d_vocab: int) -> NumericTable:
    mask = torch.zeros(d_vocab, dtype=torch.bool)
    values = torch.zeros(d_vocab, dtype=torch.long)
    ops: dict[int, str] = {}
    for i, s in enumerate(strings[:d_vocab]):
        if s is None:
            continue
        s = s.strip()
        if _INT_RE.fullmatch(s):
            mask[i], values[i] = True, int(s)
        elif s in OPERATOR_TEXTS:
            ops[i] = s
    return NumericTable(mask, values, ops)


def _check_ids(what: str, ids: Any, d_vocab: int) -> None:
    for tid in ids:
        if not 0 <= int(tid) < d_vocab:
            raise ArgumentError(f"{what} has token id {tid}: valid ids are 0..{d_vocab - 1}")


def numeric_table(
    model: Model,
    *,
    numeric_values: Mapping[int, int] | None = None,
    token_strings: Sequence[str | None] | None = None,
    operator_ids: Mapping[int, str] | None = None,
) -> NumericTable:
    """Build the numeric-token table of ``model`` once.

    Sources, first given wins: ``numeric_values`` (``{token_id: integer}``; other ids are not numeric),
    ``token_strings`` (the text of every id, index = id), else the model's tokenizer: every id is
    decoded on its own (``tokenizer.batch_decode``), so GPT-2 style ``'Ġ42'`` reads ``' 42'`` and
    SentencePiece ``'▁42'`` reads ``'42'``; a token whose stripped text matches ``-?[0-9]+`` is numeric.
    ``operator_ids`` (``{token_id: "+" | "-"}``) overrides the operator tokens found in the strings.

    Raises ``ValueError`` when the model has no tokenizer and neither table is given, or when a given
    token id is outside ``0..d_vocab-1``.
    """
    d_vocab = int(model.cfg.d_vocab)
    if numeric_values is not None:
        _check_ids("numeric_values", numeric_values, d_vocab)
        mask = torch.zeros(d_vocab, dtype=torch.bool)
        values = torch.zeros(d_vocab, dtype=torch.long)
        for tid, val in numeric_values.items():
            mask[int(tid)], values[int(tid)] = True, int(val)
        table = NumericTable(mask, values, {})
    elif token_strings is not None:
        table = _table_from_strings(list(token_strings), d_vocab)
    else:
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ArgumentError(
                "this model has no tokenizer: pass numeric_values={token_id: integer} (and operator_ids) "
                "or token_strings=[text of id 0, text of id 1, ...]"
            )
        n = min(d_vocab, len(tok))
        table = _table_from_strings(tok.batch_decode([[i] for i in range(n)]), d_vocab)
    if operator_ids is not None:
        _check_ids("operator_ids", operator_ids, d_vocab)
        table = NumericTable(table.mask, table.values, {int(k): str(v) for k, v in operator_ids.items()})
    return table
