"""Numbers written as several tokens (digit-level tokenizers: SmolLM, Qwen2/2.5/3, Gemma, Mistral, Llama-2).

With ``numbers="multi"`` a task's operands and answers may span several tokens. Conventions:

* **Layout.** Prompts are grouped so that their tokens line up position by position: the same token
  length, the same number of answer tokens, and the same *roles* (which number of the prompt, counted from
  the left, each token belongs to, or ``-1`` for the template's text). Two-digit operands on a digit
  tokenizer are one layout; ``12+3=`` and ``1+23=`` (equal length, other roles) are two. CAMA then
  conditions each digit position on its own digit token: the formula applied literally.
* **Answer.** The tokens that ``tokenizer(prompt + answer)`` adds to ``tokenizer(prompt)``, kept only when
  they are a clean continuation (the prompt's tokens are a prefix). An answer of ``k`` tokens is read under
  teacher forcing: the analysed sequence is the prompt followed by the first ``k-1`` answer tokens, and
  position ``-k+j`` must predict answer token ``j`` (:func:`interventions.readout.answer_positions`). The
  answer is right when every one of its tokens is the argmax; its probability is the product over its
  tokens, its margin the smallest (:func:`interventions.readout.readout_metrics`). Under the AF1 subgraph
  every answer position is a last token (``af1_subgraph(..., n_last=k)``). With ``k = 1`` all of this is
  the single-token analysis itself.
* A number whose tokens reach past its digits (a token joining a digit to the template's text) is dropped:
  its positions would not line up with other prompts'.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from circuits.tasks.tokens import answer_forms, answer_texts_of, encode_texts, tokenizer_of
from interventions.types import Model, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = ["filter_multi_token", "number_roles"]

_NUMBER = re.compile(r"\d+")


def number_roles(prompt: str, offsets: list[tuple[int, int]]) -> tuple[int, ...] | None:
    """Per token (character ``offsets``), the index of the number of ``prompt`` it belongs to (0 = the first
    number from the left) or ``-1`` (template text); ``None`` when a token holds a number's digits and other
    text besides a leading space (the number's positions would not line up)."""
    spans = [m.span() for m in _NUMBER.finditer(prompt)]
    roles = []
    for s, e in offsets:
        hit = [i for i, (a, b) in enumerate(spans) if s < b and e > a]
        if not hit:
            roles.append(-1)
            continue
        a, b = spans[hit[0]]
        if len(hit) > 1 or e > b or s < a - 1 or (s == a - 1 and prompt[s] != " "):
            return None
        roles.append(hit[0])
    return tuple(roles)


def filter_multi_token(ds: Dataset, model_or_tokenizer: Model | Tokenizer) -> tuple[Dataset, int]:
    """The rows whose numbers can be written as several tokens (see the module docstring), with the columns
    ``answer_text`` (the answer as written after the prompt), ``answer_ids`` (its tokens) and ``layout`` (a
    key: token length, answer length and roles). Returns ``(kept, n_dropped)``."""
    from datasets import Dataset

    tok = tokenizer_of(model_or_tokenizer)
    rows = ds.to_dict() if hasattr(ds, "to_dict") else {c: list(ds[c]) for c in ds.column_names}
    prompts = list(rows["prompt"])
    forms = answer_forms(tok, prompts, answer_texts_of(rows))
    new_prompts = [p for p, _, _ in forms]
    enc = encode_texts(tok, new_prompts, offsets=True)
    full = encode_texts(tok, [p + t for p, t, _ in forms])["input_ids"]
    keep, out_prompts, texts, ids_col, layouts = [], [], [], [], []
    for i, ((p, text, ids), base, offs, whole) in enumerate(zip(forms, enc["input_ids"], enc["offset_mapping"], full)):
        if not ids or list(whole) != list(base) + list(ids):
            continue  # the answer does not continue the prompt's tokens
        roles = number_roles(p, list(offs))
        if roles is None:
            continue
        keep.append(i)
        out_prompts.append(p)
        texts.append(text)
        ids_col.append(list(ids))
        layouts.append(f"{len(base)}:{len(ids)}:" + ",".join(map(str, roles)))
    cols = {c: [v[i] for i in keep] for c, v in rows.items() if c not in ("answer_text", "answer_ids", "layout")}
    cols.update(prompt=out_prompts, answer_text=texts, answer_ids=ids_col, layout=layouts)
    return Dataset.from_dict(cols), len(prompts) - len(keep)
