"""Per-prompt outcomes of one intervention set: which prompts keep their answer, the answer's probability and
its margin over the best other token, prompt by prompt.

A search stores them with every configuration in ``results.jsonl`` (:meth:`PromptOutcomes.to_record`: the
faithful prompts as a hexadecimal bitmask, bit ``i`` for the ``i``-th scored prompt of ``prompts.jsonl``, and
the probabilities and margins rounded to 6 digits), so a reopened run answers "which prompts does this
configuration flip" without a model (:meth:`circuits.search.SearchResult.prompt_outcomes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from circuits.errors import CorruptRunError
from interventions.types import DataFrame, JsonDict, JsonMapping

__all__ = ["FIELDS", "PromptOutcomes", "decode_mask", "encode_mask", "record_problem"]

FIELDS = ("prompt_faithful", "prompt_answer_prob", "prompt_logit_diff")
"""The keys :meth:`PromptOutcomes.to_record` adds to a results record."""

DIGITS = 6


def encode_mask(flags: Sequence[bool] | np.ndarray) -> str:
    """A bool vector as hexadecimal (bit ``i`` = element ``i``, little-endian within each byte)."""
    return np.packbits(np.asarray(flags, dtype=bool), bitorder="little").tobytes().hex()


def decode_mask(text: str, n: int) -> np.ndarray:
    """The ``[n]`` bool vector :func:`encode_mask` wrote as ``text``; ``ValueError`` if it does not hold ``n``
    (:func:`mask_problem` says what is wrong)."""
    problem = mask_problem(text, n)
    if problem is not None:
        raise CorruptRunError(f"prompt mask {problem}")
    raw = np.frombuffer(bytes.fromhex(text), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def mask_problem(text: object, n: int) -> str | None:
    """What keeps ``text`` from being the :func:`encode_mask` of ``n`` flags (``None``: nothing): a string of
    ``2 * ceil(n / 8)`` lowercase hexadecimal digits whose bits past ``n`` are zero."""
    if not isinstance(text, str):
        return f"must be a hexadecimal string, found {_brief(text)}"
    want = 2 * ((n + 7) // 8)
    if len(text) != want:
        return f"has {len(text)} hexadecimal digits, but {n} prompts need {want}"
    if any(c not in "0123456789abcdef" for c in text):
        return f"= {_brief(text)} is not lowercase hexadecimal"
    if n % 8 and int(text[-2:], 16) >> (n % 8):
        return f"sets bits past prompt {n - 1}"
    return None


def record_problem(record: JsonMapping) -> tuple[str, str] | None:
    """A ``(field, problem)`` pair for a results record whose per-prompt outcomes (:data:`FIELDS`) are malformed
    or contradict its totals (``None``: fine, or a record of an earlier release, which has none). ``n`` (an
    integer >= 1) and the totals were type-checked before. The outcomes must be: the mask of :func:`mask_problem`
    with as many bits set as ``n_faithful`` (and ``faithfulness * n``); lists of ``n`` numbers (``null`` for a
    non-finite one), probabilities in [0, 1], whose means are ``mean_answer_prob`` and ``mean_logit_diff``
    (within the rounding to :data:`DIGITS` digits and float32 sums); and no faithful prompt with a negative
    margin or unfaithful one with a positive margin (the answer is the argmax exactly when its margin over the
    best other token is positive)."""
    n = record.get("n")
    if not any(k in record for k in FIELDS) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    lists: dict[str, np.ndarray] = {}
    for name in FIELDS[1:]:
        if name not in record:
            continue
        values = record[name]
        if not isinstance(values, list):
            return name, f"must be a list of {n} numbers, found {_brief(values)}"
        if len(values) != n:
            return name, f"holds {len(values)} values for n = {n} prompts"
        for i, v in enumerate(values):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                return name, f"value {i} = {_brief(v)} is not a finite number"
            if name == "prompt_answer_prob" and v is not None and not 0.0 <= v <= 1.0:
                return name, f"value {i} = {_brief(v)} is not a probability in [0, 1]"
        lists[name] = np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
        total = record.get("mean_" + name[len("prompt_"):])
        if isinstance(total, (int, float)) and not np.isnan(lists[name]).any():
            mean = float(lists[name].mean())
            tol = 10.0 ** -DIGITS * 5 + 1e-5 * max(1.0, float(np.abs(lists[name]).max()))
            if abs(mean - total) > tol:
                return name, (f"averages {mean:.6g}, but the record's {'mean_' + name[len('prompt_'):]} is {total!r}: "
                              f"the per-prompt outcomes contradict the totals")
    if "prompt_faithful" not in record:
        return None
    text = record["prompt_faithful"]
    problem = mask_problem(text, n)
    if problem is not None:
        return "prompt_faithful", problem
    flags = decode_mask(text, n)
    k = int(flags.sum())
    n_faithful, f = record.get("n_faithful"), record.get("faithfulness")
    if isinstance(n_faithful, int) and k != n_faithful:
        return "prompt_faithful", f"marks {k} faithful prompts, but n_faithful = {n_faithful}"
    if isinstance(f, (int, float)) and abs(f - k / n) > 1e-9:
        return "prompt_faithful", f"marks {k} of {n} prompts faithful ({k / n:.6g}), but faithfulness = {f!r}"
    margin = lists.get("prompt_logit_diff")
    if margin is not None:
        known = ~np.isnan(margin)
        wrong = np.flatnonzero(known & ((flags & (margin < 0)) | (~flags & (margin > 0))))
        if len(wrong):
            i = int(wrong[0])
            return "prompt_logit_diff", (f"value {i} = {margin[i]!r} contradicts prompt {i} being marked "
                                         f"{'faithful' if flags[i] else 'unfaithful'} in prompt_faithful")
    return None


def _brief(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class PromptOutcomes:
    """Per prompt (in the order of the scored prompts): ``faithful`` (``[n]`` bool, the answer is still the
    argmax), ``answer_prob`` (``[n]``, probability of the answer; ``None`` if not stored), ``logit_diff``
    (``[n]``, answer logit minus the best other, negative = wrong) and ``prompts`` (their text, when known)."""

    faithful: np.ndarray
    answer_prob: np.ndarray | None = None
    logit_diff: np.ndarray | None = None
    prompts: list[str] | None = None
    index: np.ndarray | None = None
    """Which of the caller's prompts each row is (:func:`~circuits.faithfulness.prompt_faithfulness` drops the
    prompts the unmodified model gets wrong); ``None``: row ``i`` is prompt ``i``."""

    @classmethod
    def from_metrics(cls, correct: Any, prob: Any, logit_diff: Any,
                     prompts: Sequence[str] | None = None) -> PromptOutcomes:
        """From the three per-prompt tensors of :func:`circuits.faithfulness.last_token_metrics`."""
        as_np = lambda t: np.asarray(t.detach().cpu().double().numpy() if hasattr(t, "detach") else t)  # noqa: E731
        return cls(as_np(correct).astype(bool), as_np(prob).astype(np.float64), as_np(logit_diff).astype(np.float64),
                   list(prompts) if prompts is not None else None)

    @classmethod
    def from_record(cls, record: JsonMapping, prompts: Sequence[str] | None = None) -> PromptOutcomes | None:
        """The outcomes a results record holds (``None`` for a record of an earlier release, which has none)."""
        if not isinstance(record.get("prompt_faithful"), str):
            return None
        n = int(record["n"])
        floats = lambda k: (np.array([np.nan if v is None else v for v in record[k]], dtype=np.float64)  # noqa: E731
                            if isinstance(record.get(k), list) and len(record[k]) == n else None)
        return cls(decode_mask(record["prompt_faithful"], n), floats("prompt_answer_prob"),
                   floats("prompt_logit_diff"), list(prompts) if prompts is not None and len(prompts) == n else None)

    def to_record(self) -> JsonDict:
        """The keys of :data:`FIELDS` for a results record."""
        out: JsonDict = {"prompt_faithful": encode_mask(self.faithful)}
        if self.answer_prob is not None:
            out["prompt_answer_prob"] = [round(float(v), DIGITS) for v in self.answer_prob]
        if self.logit_diff is not None:
            out["prompt_logit_diff"] = [round(float(v), DIGITS) for v in self.logit_diff]
        return out

    @property
    def n(self) -> int:
        return int(len(self.faithful))

    @property
    def faithfulness(self) -> float:
        """Fraction of faithful prompts (the configuration's faithfulness)."""
        return float(self.faithful.mean()) if self.n else float("nan")

    def flipped(self) -> list[int]:
        """Indices of the prompts whose answer the intervention changes (not faithful)."""
        return [int(i) for i in np.flatnonzero(~self.faithful)]

    def rows(self) -> list[JsonDict]:
        """One dict per prompt: ``index``, ``prompt`` (when known), ``faithful``, ``answer_prob``, ``logit_diff``."""
        out = []
        for i in range(self.n):
            row: JsonDict = {"index": int(self.index[i]) if self.index is not None else i}
            if self.prompts is not None:
                row["prompt"] = self.prompts[i]
            row["faithful"] = bool(self.faithful[i])
            row["answer_prob"] = float(self.answer_prob[i]) if self.answer_prob is not None else None
            row["logit_diff"] = float(self.logit_diff[i]) if self.logit_diff is not None else None
            out.append(row)
        return out

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame`` of :meth:`rows` (one row per prompt)."""
        from circuits.store.frames import dataframe

        return dataframe(self.rows())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PromptOutcomes):
            return NotImplemented
        same = lambda a, b: (a is None) == (b is None) and (  # noqa: E731
            a is None or np.allclose(a, b, atol=10 ** -DIGITS, equal_nan=True))
        return bool(np.array_equal(self.faithful, other.faithful) and same(self.answer_prob, other.answer_prob)
                    and same(self.logit_diff, other.logit_diff))
