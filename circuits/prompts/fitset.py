"""The fit set: the task prompts CAMA's means (and the plain-mean and mean-head baselines) are averaged over,
separate from the prompts being scored.

CAMA replaces the state at ``(layer, t)`` by E[activation | x'_t = x_t] over the task distribution. Fitted
on the scored prompts themselves, a prompt would weigh ``1/n`` in the mean that replaces its own state
(``n`` = prompts holding its token at ``t``; ``n = 1``: not ablated at all), inflating faithfulness by an
amount that depends on the prompt count and the operand range. So the means are fitted on a **fit set**:

* drawn from the task's operand space in the order of ``seed`` (the same shuffling as the evaluation
  prompts, :func:`circuits.tasks.build_task`), kept when the prompt tokenises to the scored prompts'
  layout (the same token length) and is **not** one of the scored prompts;
* the **whole** layout (every such prompt) when the task has at most ``size`` prompts, otherwise the first
  ``size`` of them, topped up with further prompts that hold an entry the scored prompts need until every
  such ``(position, token)`` entry has ``min_count`` fit prompts (or the operand space is exhausted);
* ``population="all"`` (default: the formula's P(x | x_t) over all task prompts) or ``"correct"`` (only
  prompts the unmodified model answers correctly; costs a forward pass per candidate).

Defaults (:class:`FitSpec`): ``size`` 10000 (every two-operand catalogue task in 0..99 fits whole),
``min_count`` 5, ``seed`` 0, ``population`` ``"all"``. The runner enforces what this module promises:
no scored prompt in the fit set, every needed entry at ``min_count`` or more
(:mod:`circuits.runner`, :class:`~circuits.errors.FitSetError`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Int

from circuits.errors import ArgumentError
from circuits.prompts.fitspec import DEFAULT_MIN_COUNT, DEFAULT_SIZE, FitSpec
from interventions.coverage import row_digests
from interventions.types import JsonDict, JsonMapping, Model

if TYPE_CHECKING:
    from circuits.tasks.catalogue import TaskLike
    from circuits.tasks.formats import PromptFormat

__all__ = ["DEFAULT_MIN_COUNT", "DEFAULT_SIZE", "FitSet", "FitSpec", "draw_fit_set", "fit_passes", "fit_set_of",
           "pick_covered", "split_whole"]

CHUNK = 4096
"""Prompts drawn, tokenised (and, for ``population="correct"``, checked) per round."""
TOP_UP_ROUNDS = 16
"""Rounds of top-up draws (``CHUNK`` prompts each) after the first ``size`` fit prompts, at most."""
DRY_ROUNDS = 64
"""Rounds in a row that add no fit prompt (none of the layout, or every one scored) after which drawing stops: a
space of 10^9 prompts whose layout is rare is never drawn to its end."""


@dataclass(frozen=True)
class FitSet:
    """The prompts means are fitted on: ``tokens`` (``[n_fit, pos]``, the scored prompts' layout, BOS at 0),
    how they were drawn (``spec``, ``task``; ``None`` for tokens the caller gave), whether they are the
    layout's whole prompt space (``whole``) and how many task prompts were drawn to find them (``n_drawn``)."""

    tokens: Int[torch.Tensor, "n_fit pos"]
    spec: FitSpec
    task: str | None = None
    whole: bool = False
    n_drawn: int = 0

    @classmethod
    def given(cls, tokens: Int[torch.Tensor, "n_fit pos"], min_count: int = DEFAULT_MIN_COUNT) -> FitSet:
        """A fit set of the caller's own tokens (the API's ``fit_tokens``)."""
        return cls(tokens=tokens.long(), spec=FitSpec(size=max(1, int(tokens.shape[0])), min_count=min_count))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def sha256(self) -> str:
        """Content hash of the fit tokens (shape and ids)."""
        h = hashlib.sha256(str(tuple(self.tokens.shape)).encode())
        h.update(self.tokens.cpu().long().contiguous().numpy().tobytes())
        return h.hexdigest()

    def without(self, scored: Int[torch.Tensor, "batch pos"]) -> FitSet:
        """This fit set without the rows that are scored prompts."""
        if scored.shape[1] != self.tokens.shape[1] or not len(self.tokens):
            return self
        keep = ~torch.isin(row_digests(self.tokens), row_digests(scored))
        if bool(keep.all()):
            return self
        return FitSet(self.tokens[keep], self.spec, self.task, False, self.n_drawn)

    def identity(self) -> JsonDict:
        """What the run identity records of the fit set: how it was drawn, its size and content hash."""
        return {**self.spec.identity(), "task": self.task, "whole": self.whole, "n_fit": len(self),
                "sha256": self.sha256}


def fit_set_of(fit: FitSet | FitSpec | None, fit_tokens: Int[torch.Tensor, "n_fit pos"] | None,
               min_count: int | None = None, *, model: Model | None = None,
               tokens: Int[torch.Tensor, "batch pos"] | None = None,
               meta: JsonMapping | None = None) -> FitSet | None:
    """The API's spellings of a fit set as one: a :class:`FitSet` itself; a :class:`FitSpec`, drawn now for
    the task named in ``meta["task"]`` (:func:`draw_fit_set` on ``model`` with the scored ``tokens``); else
    ``fit_tokens`` wrapped with :meth:`FitSet.given` (``None`` when nothing is given). Two at once, or a
    ``FitSpec`` without a task, are refused in one line."""
    if fit is not None and fit_tokens is not None:
        raise ArgumentError("give the fit set once: fit= or fit_tokens=, not both")
    if isinstance(fit, FitSpec):
        task = (meta or {}).get("task")
        if not task or model is None or tokens is None:
            raise ArgumentError("fit=FitSpec(...) is drawn from a task's prompts: name the task with "
                                "meta={'task': NAME}, or pass "
                                "fit=circuits.prompts.fitset.draw_fit_set(model, NAME, tokens, spec)")
        return draw_fit_set(model, str(task), tokens, fit)
    if fit_tokens is None:
        return fit
    return FitSet.given(fit_tokens, DEFAULT_MIN_COUNT if min_count is None else min_count)


def fit_passes(n_fit: int, batch_size: int) -> int:
    """Forward passes :meth:`interventions.MeanCache.fit` needs for ``n_fit`` prompts in batches of
    ``batch_size``."""
    return -(-int(n_fit) // max(1, int(batch_size)))


def draw_fit_set(model: Model, task: TaskLike, scored: Int[torch.Tensor, "batch pos"], spec: FitSpec = FitSpec(), *,
                 prepend_bos: bool | None = None, batch_size: int = 128, numbers: str = "single",
                 layout: object = None, fmt: PromptFormat | None = None) -> FitSet:
    """The fit set of ``task`` for the scored prompts ``scored`` (``[batch, pos]``, one layout): see the
    module docstring. ``prepend_bos``, ``numbers``, ``layout`` (the key of the scored prompts' layout,
    :attr:`circuits.tasks.Layout.key`; ``None``: their token length) and ``fmt`` (the prompt format,
    :class:`~circuits.tasks.formats.PromptFormat`) as for the scored prompts."""
    from circuits.faithfulness import base_correct
    from circuits.prompts.sampling import filter_numbers
    from circuits.tasks import catalogue as tasks

    spec.validate()
    if fmt is not None:
        prepend_bos = fmt.prepend_bos(prepend_bos)
    n_pos = int(scored.shape[1])
    exclude = row_digests(scored)
    need = _needed(scored)
    space = tasks.operand_space_size(task)
    rows: list[torch.Tensor] = []
    counts: dict[tuple[int, int], int] = {}
    n_drawn = top_up = n_skipped = dry = 0
    while n_drawn < space and dry < DRY_ROUNDS:
        ds = tasks.build_task(task, n=CHUNK, seed=spec.seed, start=n_drawn)
        n_drawn += len(ds)
        if fmt is not None:
            ds = fmt.apply(ds, task, model)
        ds, _ = filter_numbers(ds, model, numbers)
        key = n_pos if layout is None else layout
        lay = next((x for x in tasks.to_layouts(model, ds, prepend_bos=prepend_bos) if x.key == key), None)
        before = len(rows)
        if lay is not None:
            keep = ~torch.isin(row_digests(lay.tokens), exclude)
            cand = lay.tokens[keep]
            if spec.population == "correct" and len(cand):
                cand = cand[base_correct(model, cand, lay.answers[keep], batch_size=batch_size)]
            taken, skipped = _take(cand, len(rows), counts, need, spec)
            rows += taken
            n_skipped += skipped
        dry = dry + 1 if len(rows) == before else 0
        if len(rows) >= spec.size:
            if all(counts.get(e, 0) >= spec.min_count for e in need):
                break
            top_up += 1
            if top_up > TOP_UP_ROUNDS:
                break
    tokens = torch.stack(rows) if rows else torch.zeros(0, n_pos, dtype=torch.long)
    return FitSet(tokens=tokens, spec=spec, task=tasks.task_label(task), whole=n_drawn >= space and n_skipped == 0,
                  n_drawn=n_drawn)


def pick_covered(candidates: Int[torch.Tensor, "n pos"], pool: Int[torch.Tensor, "m pos"], n: int,
                 min_count: int) -> tuple[list[int], int]:
    """``(picked, set aside)``: the first ``n`` rows of ``candidates`` (in order; each also a row of ``pool``) such
    that every ``(position, token)`` entry (positions ``>= 1``) of each picked row keeps at least ``min_count`` rows
    of ``pool`` that are not picked; ``set aside``: candidates passed over before the ``n``-th was found. A row is
    picked only when, after taking it, every entry it reads still has ``min_count`` unpicked pool rows, so the
    guarantee holds for all picked rows at the end."""
    from collections import Counter

    counts: Counter = Counter()
    for row in pool[:, 1:].tolist():
        counts.update(enumerate(row))
    picked: list[int] = []
    aside = 0
    for i, row in enumerate(candidates[:, 1:].tolist()):
        if len(picked) == n:
            break
        entries = list(enumerate(row))
        if min_count and any(counts[e] - 1 < min_count for e in entries):
            aside += 1
            continue
        counts.subtract(entries)
        picked.append(i)
    return picked, aside


def split_whole(fit: FitSet, scored: Int[torch.Tensor, "batch pos"],
                n: int) -> tuple[Bool[torch.Tensor, " batch"], FitSet]:
    """For a fit set that holds the layout's whole prompt space apart from the drawn ``scored`` prompts: ``(keep,
    fit)``, ``keep`` (``[batch]`` bool) marking the first ``n`` scored prompts that :func:`pick_covered` can back
    from the rest of the space, and the fit set that is the space without them (the prompts set aside go back into
    it). A small task (a few hundred prompts) has no prompts to spare: every scored prompt is one fewer fit prompt
    for the entries it reads."""
    pool = torch.cat([fit.tokens, scored.to(fit.tokens.device)]) if len(fit) else scored
    picked, _ = pick_covered(scored, pool, n, fit.spec.min_count)
    keep = torch.zeros(len(scored), dtype=torch.bool)
    keep[picked] = True
    rest = pool[~torch.isin(row_digests(pool), row_digests(scored[keep]))]
    return keep, FitSet(rest, fit.spec, fit.task, fit.whole, fit.n_drawn)


def _needed(scored: Int[torch.Tensor, "batch pos"]) -> set[tuple[int, int]]:
    """The ``(position, token)`` entries (positions ``>= 1``) the scored prompts read."""
    pos = torch.arange(scored.shape[1]).expand_as(scored)[:, 1:].reshape(-1).tolist()
    return set(zip(pos, scored.cpu()[:, 1:].reshape(-1).tolist()))


def _take(cand: torch.Tensor, n_rows: int, counts: dict[tuple[int, int], int], need: set[tuple[int, int]],
          spec: FitSpec) -> tuple[list[torch.Tensor], int]:
    """``(rows to add, rows passed over)`` of the candidates, counting the added rows' entries into
    ``counts``: every row until the fit set holds ``spec.size`` (``n_rows`` so far), then only rows
    holding a needed entry still under ``spec.min_count``."""
    out: list[torch.Tensor] = []
    skipped = 0
    for row in cand:
        entries = list(zip(range(1, len(row)), row[1:].tolist()))
        if n_rows + len(out) >= spec.size and not any(
                e in need and counts.get(e, 0) < spec.min_count for e in entries):
            skipped += 1
            continue
        for e in entries:
            counts[e] = counts.get(e, 0) + 1
        out.append(row)
    return out, skipped
