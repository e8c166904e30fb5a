"""Checks of a task file against a model's tokenizer, made before any prompt is drawn.

A slot of string values must line up across the prompts of one layout (one token length): CAMA conditions
each position on its token, and the reports name positions by the template's text. Two things break that,
and each is one :class:`~circuits.errors.ArgumentError` line naming the task file and the slot:

* a value whose tokens reach into the template's text around it (other than one leading space), e.g. ``"ab"``
  before ``"c."`` on a tokenizer that writes ``"abc"`` as one token: the value has no positions of its own;
* two or more slots whose values take different numbers of tokens: prompts of one token length could then
  hold the slots at different positions (one varying slot is fine: its prompts are grouped by length).

Integer slots follow the number rules of :mod:`circuits.tasks.tokens` and :mod:`circuits.tasks.digits` instead.
"""

from __future__ import annotations

from typing import Any

from circuits.errors import ArgumentError
from interventions.types import Model, Tokenizer

__all__ = ["check_slot_tokens", "slot_token_counts"]


def _sample(spec: Any, slot: int, index: int) -> tuple[str, tuple[int, int]]:
    """The prompt with value ``index`` in slot ``slot`` (every other slot at its first value) and the character
    span of that value (its first occurrence in the template)."""
    values = [lo for lo, _ in spec.operand_ranges]
    values[slot] = index
    marker = "\0"
    shown = {k: (marker if i == slot else spec.value(i, v)) for i, (k, v) in enumerate(zip(spec.operand_names, values))}
    head = spec.prefix + spec.template.format(**shown).split(marker)[0]
    text = spec.prompt(values)
    return text, (len(head), len(head) + len(str(spec.value(slot, index))))


def slot_token_counts(spec: Any, tokenizer: Model | Tokenizer) -> dict[str, dict[str, int]]:
    """Per string slot, the number of tokens each value takes in the prompt (every other slot at its first
    value); :class:`~circuits.errors.ArgumentError` for a value sharing a token with the template's text."""
    from circuits.tasks.tokens import encode_texts, tokenizer_of

    tok = tokenizer_of(tokenizer)
    out: dict[str, dict[str, int]] = {}
    for slot, values in enumerate(spec.slot_values or ()):
        if values is None:
            continue
        name = spec.operand_names[slot]
        samples = [_sample(spec, slot, i) for i in range(len(values))]
        enc = encode_texts(tok, [t for t, _ in samples], offsets=True)
        counts = {}
        for value, (text, (a, b)), offs in zip(values, samples, enc["offset_mapping"]):
            hit = [(s, e) for s, e in offs if s < b and e > a]
            bad = [(s, e) for s, e in hit if e > b or s < a - 1 or (s == a - 1 and text[s] != " ")]
            if bad:
                s, e = bad[0]
                where = f"task file {spec.path}" if spec.path else f"task {spec.name!r}"
                raise ArgumentError(f"{where}: slots.{name}: value {value!r} shares the token {text[s:e]!r} with the "
                                    f"template's text, so it has no positions of its own; put a space or punctuation "
                                    f"between the slot and the text around it")
            counts[value] = len(hit)
        out[name] = counts
    return out


def check_slot_tokens(spec: Any, tokenizer: Model | Tokenizer) -> None:
    """Raise :class:`~circuits.errors.ArgumentError` (naming the task file and the slot) when the string slots of
    ``spec`` cannot line up across a layout (see the module docstring); nothing for integer-only tasks."""
    if not spec.slot_values:
        return
    counts = slot_token_counts(spec, tokenizer)
    varying = {name: c for name, c in counts.items() if len(set(c.values())) > 1}
    if len(varying) > 1:
        (first, c1), (second, _) = list(varying.items())[:2]
        lo = min(c1, key=c1.__getitem__)
        hi = max(c1, key=c1.__getitem__)
        where = f"task file {spec.path}" if spec.path else f"task {spec.name!r}"
        raise ArgumentError(f"{where}: slots.{first}: values take different numbers of tokens ({lo!r} {c1[lo]}, "
                            f"{hi!r} {c1[hi]}) and so do those of slots.{second}: prompts of one token length would "
                            f"not line up slot by slot; give each slot but one values of one token count")
