"""Checks of a task file against a model's tokenizer, made before any prompt is drawn.

A slot of string values must line up across the prompts of one layout (one token length): CAMA conditions
each position on its token, and the reports name positions by the template's text. Two things break that,
and each is one :class:`~circuits.errors.ArgumentError` line naming the task file and the slot:

* a value whose tokens reach into the template's text around it (other than one leading space), e.g. ``"ab"``
  before ``"c."`` on a tokenizer that writes ``"abc"`` as one token: the value has no positions of its own;
* two or more slots whose values take different numbers of tokens: prompts of one token length could then
  hold the slots at different positions (one varying slot is fine: its prompts are grouped by length).

Integer slots follow the number rules of :mod:`circuits.tasks.tokens` and :mod:`circuits.tasks.digits` instead,
and one more (:func:`check_number_tokens`): a slot may not range over numbers the tokenizer cannot read at all (its
unknown token, e.g. ``1999`` for a zoo model whose vocabulary holds 0..520): such prompts would be scored as
``<unk>+3=``. The task is refused naming the slot, the unknown numbers and the range to use instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from circuits.errors import ArgumentError
from interventions.types import Model, Tokenizer

if TYPE_CHECKING:
    from circuits.tasks.catalogue import TaskSpec

__all__ = ["MAX_CHECKED_VALUES", "check_number_tokens", "check_slot_tokens", "slot_token_counts", "spans",
           "unknown_numbers"]

MAX_CHECKED_VALUES = 20_000
"""Integers of a slot checked against the tokenizer: all of a range this long or shorter, else this many evenly
spaced ones (both ends included)."""


def _sample(spec: TaskSpec, slot: int, index: int) -> tuple[str, tuple[int, int]]:
    """The prompt with value ``index`` in slot ``slot`` (every other slot at its first value) and the character
    span of that value (its first occurrence in the template)."""
    values = [lo for lo, _ in spec.operand_ranges]
    values[slot] = index
    marker = "\0"
    shown = {k: (marker if i == slot else spec.value(i, v)) for i, (k, v) in enumerate(zip(spec.operand_names, values))}
    head = spec.prefix + spec.template.format(**shown).split(marker)[0]
    text = spec.prompt(values)
    return text, (len(head), len(head) + len(str(spec.value(slot, index))))


def slot_token_counts(spec: TaskSpec, tokenizer: Model | Tokenizer) -> dict[str, dict[str, int]]:
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


def check_slot_tokens(spec: TaskSpec, tokenizer: Model | Tokenizer) -> None:
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


def unknown_numbers(tokenizer: Model | Tokenizer, lo: int, hi: int) -> list[int]:
    """The integers of ``lo..hi`` that ``tokenizer`` reads as (or with) its unknown token, in increasing order: all
    of them, or of :data:`MAX_CHECKED_VALUES` evenly spaced ones for a longer range; none for a tokenizer without an
    unknown token (byte-level BPE reads every number, in pieces if need be)."""
    from circuits.tasks.tokens import tokenizer_of

    tok = tokenizer_of(tokenizer)
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or hi < lo:
        return []
    if hi - lo + 1 <= MAX_CHECKED_VALUES:
        values = list(range(lo, hi + 1))
    else:
        step = (hi - lo) / (MAX_CHECKED_VALUES - 1)
        values = sorted({lo + round(i * step) for i in range(MAX_CHECKED_VALUES)} | {hi})
    ids = tok([str(v) for v in values], add_special_tokens=False)["input_ids"]
    return [v for v, row in zip(values, ids) if unk in row]


def spans(values: list[int], limit: int = 3) -> str:
    """Increasing integers as ranges, ``"521..2000"`` or ``"3, 7..9, 12, ..."`` (the first ``limit`` ranges)."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(f"{a}..{b}" if b > a else f"{a}" for a, b in runs[:limit])
    return text + (", ..." if len(runs) > limit else "")


def check_number_tokens(spec: TaskSpec, tokenizer: Model | Tokenizer) -> None:
    """:class:`~circuits.errors.ArgumentError` when an integer slot of ``spec`` ranges over numbers ``tokenizer``
    cannot read (:func:`unknown_numbers`), naming the task, the slot, those numbers and a range it can read; before
    any prompt is drawn or scored."""
    from circuits.tasks.tokens import tokenizer_of

    tok = tokenizer_of(tokenizer)
    for slot, (name, (lo, hi)) in enumerate(zip(spec.operand_names, spec.operand_ranges)):
        if spec.slot_values and spec.slot_values[slot] is not None:
            continue  # a slot of string values: check_slot_tokens
        unknown = unknown_numbers(tok, int(lo), int(hi))
        if not unknown:
            continue
        where = f"task file {spec.path}" if spec.path else f"task {spec.name!r}"
        first = unknown[0]
        fix = (f"narrow slots.{name} to range = [{lo}, {first - 1}]" if first > lo else
               f"give slots.{name} a range of numbers the tokenizer knows")
        sampled = "" if int(hi) - int(lo) + 1 <= MAX_CHECKED_VALUES else f" (of {MAX_CHECKED_VALUES} checked)"
        raise ArgumentError(f"{where}: slots.{name} ranges over {lo}..{hi}, but {len(unknown)}{sampled} of those "
                            f"numbers ({spans(unknown)}) are unknown to this model's tokenizer (read as "
                            f"{getattr(tok, 'unk_token', None)!r}), so prompts holding them cannot be read; {fix}")
