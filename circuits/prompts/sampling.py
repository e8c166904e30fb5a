"""Evaluation prompts of a task that a model answers correctly, found by sampling in rounds.

:func:`prepare_prompts` draws prompts from the task's operand space (shuffled once per seed, never
repeating a prompt) round after round, keeps those whose numbers are single tokens (see
:mod:`circuits.tasks.tokens`) and that the model answers correctly, and stops when one layout (token
length) holds ``n_prompts`` of them, when the operand space is exhausted, or when ``max_checked``
prompts have been checked. Re-exported by :mod:`circuits.models.loading`.

Conventions: the answer is the argmax of the float32 logits at position -1; BOS at position 0 when
prepended (``prepend_bos=None``: the model's own default, see ``tasks.resolve_bos``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Int

from circuits.errors import ArgumentError, PromptError
from circuits.tasks.checks import check_number_tokens, check_slot_tokens
from circuits.tasks.positions import check_text_fits
from circuits.tasks.tokens import answer_value, check_prepend_bos, tokenizer_of
from circuits.validation import check_choice, check_positive
from circuits.vocab import NUMBERS, SOURCES  # SOURCES re-exported: circuits.models.loading.SOURCES
from interventions.types import JsonDict, Model

if TYPE_CHECKING:
    from circuits.tasks.catalogue import TaskLike, TaskSpec
    from circuits.tasks.formats import PromptFormat
    from circuits.tasks.tokens import Layout
    from datasets import Dataset

MAX_CHECKED = 20_000
ZERO_CHECKED = 100
"""Prompts checked before a model that answers none of them is called one of zero base accuracy: with ``n`` checked
and none correct, the accuracy is below ``3 / n`` at 95% confidence (the rule of three), 3% after 100."""
"""Default budget of :func:`prepare_prompts`: prompts whose correctness is checked (forward passes)."""
DRY_DRAWS = 20_000
"""Prompts :func:`prepare_prompts` draws at most while none has numbers the tokenizer writes as it must (one token
each with ``numbers="single"``): then it stops and says why, instead of drawing from a space of 10^9 forever."""


@dataclass
class Prompts:
    """Evaluation prompts of one layout, all answered correctly by the unmodified model.

    Attributes:
        tokens: ``[batch, pos]`` token ids, one token length; BOS at position 0 when ``prepend_bos``.
        answers: ``[batch]`` answer token ids (the expected argmax at the last position).
        prompts: prompt texts (without BOS), aligned with ``tokens``.
        answer_values: the answers, aligned with ``tokens`` (integers; strings for a task whose answers are text).
        base_accuracy: fraction of checked prompts (single-token numbers) the model answers correctly.
        n_checked: number of prompts whose correctness was checked.
        n_correct: number of those answered correctly (all layouts).
        task: task name; ``source``: ``"build"`` (generated with ``seed``) or ``"frozen"``.
        n_layouts: number of token-length layouts among the correct prompts; only the largest is kept.
        n_dropped_multi_token: drawn prompts dropped because an operand or the answer is several tokens.
        n_drawn: prompts drawn from the task (checked or dropped; at most the operand space).
        n_wrong: checked prompts the model answers wrongly (``n_checked - n_correct``).
        prepend_bos: whether position 0 holds BOS; ``bos_token``: its id (``None`` without BOS).
        answer_texts: the answer as written after each prompt (``"112"`` / ``" 112"``), when known.
        stop: why sampling stopped: ``"found"``, ``"exhausted"`` (operand space) or ``"budget"``.
        fit: the :class:`~circuits.prompts.fitset.FitSet` of the means (``circuits.prompts.spec.PromptSpec.prepare``),
            or ``None``; ``n_dropped_fit``: correct prompts set aside because a mean they read had fewer fit
            prompts than the minimum.
        numbers: ``"single"`` or ``"multi"`` (see :func:`prepare_prompts`); ``layout``: the key of their layout
            (:attr:`circuits.tasks.Layout.key`), so that a fit set can be drawn in the same one; ``fmt``: the
            :class:`~circuits.tasks.formats.PromptFormat` (``None``: zero-shot).
    """

    tokens: Int[torch.Tensor, "batch pos"]
    answers: Int[torch.Tensor, " batch"]
    prompts: list[str]
    answer_values: list[int | str]
    base_accuracy: float
    n_checked: int
    n_correct: int = 0
    task: str = ""
    source: str = "build"
    seed: int = 0
    n_layouts: int = 1
    n_dropped_multi_token: int = 0
    extra: JsonDict = field(default_factory=dict)
    n_drawn: int = 0
    n_wrong: int = 0
    prepend_bos: bool = True
    bos_token: int | None = None
    answer_texts: list[str] | None = None
    stop: str = "found"
    fit: Any = None
    n_dropped_fit: int = 0
    numbers: str = "single"
    layout: Hashable | None = None
    fmt: PromptFormat | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def subset(self, keep: Bool[torch.Tensor, " batch"] | None, n: int) -> Prompts:
        """The first ``n`` prompts among those ``keep`` (``[batch]`` bool; ``None``: all) marks, with the
        same counts."""
        idx = torch.arange(len(self)) if keep is None else keep.nonzero().flatten()
        idx = idx[:n]
        pick = idx.tolist()
        return replace(
            self, tokens=self.tokens[idx], answers=self.answers[idx], prompts=[self.prompts[i] for i in pick],
            answer_values=[self.answer_values[i] for i in pick],
            answer_texts=None if self.answer_texts is None else [self.answer_texts[i] for i in pick],
        )

    def records(self) -> list[JsonDict]:
        """One ``{"prompt", "answer", "answer_token"}`` dict per prompt (for ``prompts.jsonl``), plus
        ``"answer_text"`` (the answer as written after the prompt, e.g. ``" 112"``) when known."""
        out = [
            {"prompt": p, "answer": answer_value(a), "answer_token": t}
            for p, a, t in zip(self.prompts, self.answer_values, self.answers.tolist())
        ]
        if self.answer_texts is not None:
            for rec, text in zip(out, self.answer_texts):
                rec["answer_text"] = text
        return out

    def summary(self) -> JsonDict:
        """The sampling counts as a JSON-ready dict (for ``run.json`` / logs)."""
        return {"n_prompts": len(self), "base_accuracy": self.base_accuracy, "n_drawn": self.n_drawn,
                "n_dropped_multi_token": self.n_dropped_multi_token, "n_checked": self.n_checked,
                "n_correct": self.n_correct, "n_wrong": self.n_wrong, "n_layouts": self.n_layouts,
                "prepend_bos": self.prepend_bos, "stop": self.stop, "n_dropped_fit": self.n_dropped_fit}


def check_bos(model: Model, tokens: Int[torch.Tensor, "batch pos"], what: str = "CAMA and the fast search") -> None:
    """Raise :class:`~circuits.errors.PromptError` unless position 0 of every prompt holds the model's BOS token.

    CAMA and the fast AF1 search treat position 0 as a fixed BOS whose state is the same in every
    prompt; models that do not prepend BOS by default (Pythia, Qwen2) need ``--prepend-bos``."""
    from circuits.tasks import catalogue as tasks

    bos = tasks.resolve_bos(model, True)
    assert bos is not None  # prepend_bos=True: a token id, or resolve_bos raised
    first = tokens[:, 0]
    if not bool((first == bos).all()):
        raise PromptError(f"{what} need BOS (token {bos}) at position 0 of every prompt, but this model does "
                         f"not prepend it by default: use --prepend-bos (prepare_prompts(..., prepend_bos=True))")


def filter_numbers(ds: Dataset, model: Model, numbers: str = "single") -> tuple[Dataset, int]:
    """``(kept rows, dropped)``: rows whose numbers are single tokens (``numbers="single"``,
    :func:`circuits.tasks.filter_single_token`) or may span several (``"multi"``,
    :func:`circuits.tasks.digits.filter_multi_token`)."""
    from circuits.tasks import catalogue as tasks

    if numbers == "multi":
        from circuits.tasks.digits import filter_multi_token

        return filter_multi_token(ds, model)
    return tasks.filter_single_token(ds, model, verbose=False)


def _head(ds: Dataset, k: int) -> Dataset:
    """The first ``k`` rows of a dataset (or list)."""
    return ds.select(range(k)) if hasattr(ds, "select") else ds[:k]


def _frozen_window(ds: Dataset, start: int, n: int) -> Dataset:
    stop = min(len(ds), start + n)
    return ds.select(range(start, stop)) if hasattr(ds, "select") else ds[start:stop]


def _merge(pieces: list[Layout]) -> JsonDict:
    """Concatenate layout pieces of one token length (from successive rounds)."""
    texts = [getattr(p, "answer_texts", None) for p in pieces]
    return {
        "tokens": torch.cat([p.tokens for p in pieces]).long(),
        "answers": torch.cat([torch.as_tensor(p.answers, dtype=torch.long) for p in pieces]),
        "prompts": [x for p in pieces for x in p.prompts],
        "answer_values": [answer_value(v) for p in pieces for v in p.answer_values],
        "answer_texts": None if any(t is None for t in texts) else [x for t in texts if t is not None for x in t],
    }


def prepare_prompts(
    model: Model,
    task: TaskLike,
    n_prompts: int,
    seed: int = 0,
    *,
    source: str = "build",
    oversample: int = 3,
    min_prompts: int | None = None,
    max_checked: int = MAX_CHECKED,
    prepend_bos: bool | None = None,
    progress: bool = True,
    numbers: str = "single",
    fmt: PromptFormat | None = None,
) -> Prompts:
    """``n_prompts`` prompts of ``task`` that ``model`` answers correctly, all in one layout.

    Rounds: rows ``start .. start + size - 1`` of the task's operand space shuffled with ``seed``
    (``tasks.build_task(..., start=start)``; with ``source="frozen"`` the frozen set in order) ->
    ``tasks.filter_single_token`` (numbers that are one token, answer written as the tokenizer writes
    it) -> ``tasks.filter_correct`` -> ``tasks.to_layouts`` -> correct prompts collected per layout. The
    first round draws ``oversample * n_prompts`` prompts, later ones as many as the observed yield says
    are still needed. Sampling stops when the largest layout holds ``n_prompts`` prompts, when the
    operand space is exhausted, when ``max_checked`` prompts have been checked (default
    :data:`MAX_CHECKED` = 20000; raise it for weak models), or at once when the model answers none of
    the first checked batch. A tqdm bar shows progress (``progress=False`` hides it).

    Args:
        prepend_bos: BOS at position 0; ``None`` = the model's default (``model.cfg.default_prepend_bos``:
            True for GPT-2, GPT-J, Llama; False for Pythia/GPT-NeoX and Qwen2). The AF1 search and CAMA
            need BOS (see :func:`check_bos`).
        min_prompts: fewest prompts accepted when sampling stops early (default ``n_prompts``).
        numbers: ``"single"`` (every operand and the answer one token, the AF1 papers' setting) or
            ``"multi"`` (several tokens allowed, for digit-level tokenizers; :mod:`circuits.tasks.digits`: layouts
            line up digit by digit, answers of ``k`` tokens are read under teacher forcing).
        fmt: a :class:`~circuits.tasks.formats.PromptFormat` (solved examples before the query, the chat template;
            ``None``: zero-shot, as the AF1 papers).

    Raises one line: :class:`~circuits.errors.ArgumentError` for arguments out of range (e.g. ``n_prompts``
    larger than the operand space), :class:`~circuits.errors.PromptError` for no single-token prompt, zero
    accuracy, or fewer than ``min_prompts`` correct prompts in one layout (naming the count that works).
    """
    from tqdm.auto import tqdm

    from circuits.tasks import catalogue as tasks

    check_positive("n_prompts", n_prompts)
    check_choice("source", source, SOURCES)
    check_positive("max_checked", max_checked)
    check_prepend_bos(prepend_bos)
    check_choice("numbers", numbers, NUMBERS)
    if fmt is not None:
        prepend_bos = fmt.prepend_bos(prepend_bos)
    need = n_prompts if min_prompts is None else int(min_prompts)
    if not 1 <= need <= n_prompts:
        raise ArgumentError(f"min_prompts={min_prompts!r} must be between 1 and n_prompts={n_prompts}")
    spec, label = tasks.get_task(task), tasks.task_label(task)
    check_text_fits(fmt.prefix(spec) if fmt is not None else spec.prefix, model, tokenizer_of(model),
                    f"the text before every prompt of task {label!r} (its prefix and --shots examples)")
    check_slot_tokens(spec, model)
    check_number_tokens(spec, model)
    frozen = tasks.frozen_set(task) if source == "frozen" else None
    space = len(frozen) if frozen is not None else tasks.operand_space_size(task)
    if n_prompts > space:
        what = "its frozen set has" if frozen is not None else "its operand space has"
        raise ArgumentError(f"n_prompts={n_prompts} is more than task {label!r} can give ({what} {space} "
                            f"prompts): lower --n-prompts to {space} or less")

    by_len: dict[Hashable, list[Layout]] = {}
    n_drawn = n_dropped = n_checked = n_correct = 0
    size = max(1, int(oversample)) * n_prompts
    stop = "found"
    bar = tqdm(total=n_prompts, desc=f"prompts of {spec.name}", unit="prompt", disable=not progress, leave=False)
    try:
        while True:
            size = min(size, space - n_drawn)
            if frozen is not None:
                ds = _frozen_window(frozen, n_drawn, size)
            else:
                ds = tasks.build_task(task, n=size, seed=seed, start=n_drawn)
            n_drawn += size
            if fmt is not None:
                ds = fmt.apply(ds, task, model)
            ds, dropped = filter_numbers(ds, model, numbers)
            n_dropped += int(dropped)
            if len(ds) > max_checked - n_checked:
                ds = _head(ds, max_checked - n_checked)
            if len(ds):
                n_checked += len(ds)
                ds, _ = tasks.filter_correct(model, ds, prepend_bos=prepend_bos)
                n_correct += len(ds)
            best = max((sum(int(p.tokens.shape[0]) for p in v) for v in by_len.values()), default=0)
            if len(ds):
                for lay in tasks.to_layouts(model, ds, prepend_bos=prepend_bos):
                    key = getattr(lay, "key", None)
                    by_len.setdefault(int(lay.tokens.shape[1]) if key is None else key, []).append(lay)
                best = max(sum(int(p.tokens.shape[0]) for p in v) for v in by_len.values())
            bar.n = min(best, n_prompts)
            bar.set_postfix(drawn=n_drawn, checked=n_checked, correct=n_correct)
            bar.refresh()
            if best >= n_prompts:
                break
            if n_checked >= ZERO_CHECKED and not n_correct:
                break  # answers none of enough prompts to say its accuracy is below 3 / n_checked
            if n_drawn >= space:
                stop = "exhausted"
                break
            if n_checked >= max_checked:
                stop = "budget"
                break
            if n_checked == 0 and n_drawn >= DRY_DRAWS:
                stop = "dry"
                break
            # Next round: what the yield so far (prompts in the best layout per drawn) says is missing.
            rate = best / n_drawn
            missing = n_prompts - best
            size = max(n_prompts, math.ceil(1.2 * missing / rate)) if rate > 0 else 4 * size
            size = min(size, 100_000) if n_checked else max(1, min(size, DRY_DRAWS - n_drawn))
    finally:
        bar.close()
    return replace(_result(spec, label, n_prompts, seed, source, by_len, need, stop, max_checked, prepend_bos,
                           n_drawn=n_drawn, n_dropped=n_dropped, n_checked=n_checked, n_correct=n_correct),
                   numbers=numbers, fmt=fmt)


def zero_bound(n_checked: int) -> float:
    """The 95% upper confidence bound of an accuracy measured as 0 of ``n_checked`` prompts: ``1 - 0.05 ** (1 / n)``
    (exact binomial; about ``3 / n``, the rule of three)."""
    return 1.0 - 0.05 ** (1.0 / max(1, int(n_checked)))


def _result(spec: TaskSpec, task: str, n_prompts: int, seed: int, source: str, by_len: dict[Hashable, list[Layout]],
            need: int, stop: str, max_checked: int, prepend_bos: bool | None, *, n_drawn: int, n_dropped: int,
            n_checked: int, n_correct: int) -> Prompts:
    """The :class:`Prompts` of the largest layout, or the one-line error saying what is missing."""
    if n_checked == 0:
        if not spec.numeric:
            where = f"task file {spec.path}: answer" if spec.path else f"task {task!r}"
            raise PromptError(f"{where}: none of the {n_drawn} drawn prompts has an answer of one token for this "
                              f"model's tokenizer (answer_format {spec.answer_format!r}); allow answers of several "
                              f"tokens (--numbers multi) or choose one-token answers")
        where = f"task file {spec.path}: slots" if spec.path else f"task {task!r}"
        sample = f" (a sample: drawing stops after {DRY_DRAWS} without one)" if stop == "dry" else ""
        raise PromptError(f"{where}: none of the {n_drawn} drawn prompts has single-token numbers for this "
                          f"model's tokenizer{sample}; narrow the slot ranges (or set answer_min/answer_max) to "
                          f"numbers it writes as one token, or allow numbers of several tokens (--numbers multi)")
    base_acc = n_correct / n_checked
    if n_correct == 0:
        few = "" if n_checked >= ZERO_CHECKED else (
            f"; only {n_checked} could be checked ("
            + ("--max-checked" if stop == "budget" else "the task has no more") + "), too few to say more")
        raise PromptError(f"task {task!r}: the model answers none of the {n_checked} checked prompts correctly "
                          f"(base accuracy below {zero_bound(n_checked):.1%} at 95% confidence{few}); choose a model "
                          f"trained on this task or an easier task")
    _, pieces = max(by_len.items(), key=lambda kv: (sum(int(p.tokens.shape[0]) for p in kv[1]),
                                                     -int(kv[1][0].tokens.shape[1])))
    n_pos = int(pieces[0].tokens.shape[1])
    n_best = sum(int(p.tokens.shape[0]) for p in pieces)
    if n_best < need:
        if source == "frozen":
            more = "use --source build (more prompts)"
        else:
            more = f"lower --n-prompts to {n_best} or less"
            more += (f", raise --max-checked above {max_checked}" if stop == "budget" else "")
            more += ", or use a model that is more accurate on this task"
        raise PromptError(
            f"too few correct prompts for task {task!r}: {n_correct} of {n_checked} checked prompts are "
            f"answered correctly (base accuracy {base_acc:.1%}), {n_best} of them in the largest layout "
            f"({n_pos} tokens), but {need} are needed; {more}"
        )
    merged = _merge(pieces)
    k = min(n_prompts, n_best)
    bos = getattr(pieces[0], "bos", None)
    return Prompts(
        tokens=merged["tokens"][:k],
        answers=merged["answers"][:k],
        prompts=merged["prompts"][:k],
        answer_values=merged["answer_values"][:k],
        base_accuracy=float(base_acc),
        n_checked=int(n_checked),
        n_correct=int(n_correct),
        task=task,
        source=source,
        seed=int(seed),
        n_layouts=len(by_len),
        n_dropped_multi_token=int(n_dropped),
        n_drawn=int(n_drawn),
        n_wrong=int(n_checked - n_correct),
        prepend_bos=bos is not None if hasattr(pieces[0], "bos") else prepend_bos is not False,
        bos_token=bos,
        answer_texts=None if merged["answer_texts"] is None else merged["answer_texts"][:k],
        stop=stop,
        layout=getattr(pieces[0], "key", None),
    )


def self_answer_prompts(model: Model, tokens: Int[torch.Tensor, "batch pos"], task: str = "self") -> Prompts:
    """Prompts whose answers are the model's own argmax at the last position (base accuracy 1).

    For models without a task (e.g. randomly initialised ones): every prompt counts as answered
    correctly, so the AF1 search measures how much of the model's own prediction a subgraph keeps.
    """
    import interventions as iv

    with torch.inference_mode():
        answers = iv.run_many(model, [(tokens, [])])[0][:, -1].float().argmax(-1).cpu()
    n = int(tokens.shape[0])
    return Prompts(
        tokens=tokens.long(),
        answers=answers,
        prompts=[" ".join(str(t) for t in row.tolist()) for row in tokens],
        answer_values=answers.tolist(),
        base_accuracy=1.0,
        n_checked=n,
        n_correct=n,
        task=task,
        source="self",
        n_drawn=n,
    )
