"""Which prompts a run scores, as a value: the prompts with their fit set (:class:`PromptSpec`; the model is a
:class:`~circuits.models.spec.ModelSpec`).

The command line, the sweep config and the Python API all build these; nothing below them reads an
argparse ``Namespace``. ``ModelSpec.load()`` prints the memory estimate and loads the model;
``PromptSpec.prepare(model)`` returns the evaluation prompts and, when the analysis needs means, the fit
set they are fitted on (:mod:`circuits.prompts.fitset`)::

    model = ModelSpec("arith-gpt2").load()
    prompts = PromptSpec("add_sub", n_prompts=200).prepare(model, means="cama")
    search_af1(model, prompts.tokens, prompts.answers, fit=prompts.fit)

The task is a catalogue name, a task file (``PromptSpec("my_task.toml")``, :mod:`circuits.tasks.files`) or a
:class:`~circuits.tasks.TaskSpec`; ``PromptSpec(prompts="my.jsonl")`` (or a ``datasets.Dataset``) takes the
prompts from a dataset instead (:mod:`circuits.prompts.datasets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from circuits.errors import ArgumentError, PromptError
from circuits.prompts import sampling
from circuits.prompts.fitset import FitSet, FitSpec, split_whole
from circuits.tasks.formats import PromptFormat
from circuits.vocab import NUMBERS, SOURCES

__all__ = ["MAX_REDRAWS", "PromptSpec", "fit_covered"]

ONE_SOURCE = ("give exactly one of a task (task=, --task NAME or FILE.toml) and a prompt dataset (prompts=, "
              "--prompts FILE.jsonl|csv)")
"""The error when both or neither are given."""

MAX_REDRAWS = 3
"""Times :meth:`PromptSpec.prepare` draws more prompts to replace those set aside for thin means."""


@dataclass(frozen=True)
class PromptSpec:
    """The evaluation prompts of a run: ``n_prompts`` prompts of ``task`` (a catalogue name, a task file path or a
    :class:`~circuits.tasks.TaskSpec`) or of the dataset ``prompts`` (a ``.jsonl`` / ``.csv`` path or a
    ``datasets.Dataset``, :mod:`circuits.prompts.datasets`; exactly one of the two) the model answers correctly, drawn
    with ``seed`` (``source="build"``) or from the task's frozen set, checking at most ``max_checked``
    (``None``: :data:`circuits.prompts.MAX_CHECKED`), BOS per ``prepend_bos`` (``None``: the model's default),
    the fit set of their means (``fit``) and whether numbers may span several tokens (``numbers``:
    ``"single"`` or ``"multi"``, :mod:`circuits.tasks.digits`) and the prompt ``format`` (solved examples, the chat
    template; :mod:`circuits.tasks.formats`)."""

    task: Any = None
    n_prompts: int = 200
    seed: int = 0
    source: str = "build"
    max_checked: int | None = None
    prepend_bos: bool | None = None
    fit: FitSpec = field(default_factory=FitSpec)
    numbers: str = "single"
    format: PromptFormat = field(default_factory=PromptFormat)
    prompts: Any = None

    @property
    def label(self) -> str:
        """How runs name the prompts: the task (:func:`circuits.tasks.task_label`) or the dataset."""
        from circuits.prompts.datasets import prompts_label
        from circuits.tasks import catalogue as tasks

        return prompts_label(self.prompts) if self.prompts is not None else tasks.task_label(self.task)

    def validate(self) -> PromptSpec:
        """Raise :class:`~circuits.errors.ArgumentError` naming the first bad field (no model needed)."""
        if (self.task is None) == (self.prompts is None):
            raise ArgumentError(ONE_SOURCE)
        if self.prompts is not None and self.format.shots:
            raise ArgumentError("--shots draws solved examples from a task: with --prompts write them into the prompts")
        if self.source not in SOURCES:
            raise ArgumentError(f"source={self.source!r} is not valid: choose one of {', '.join(SOURCES)}")
        if self.numbers not in NUMBERS:
            raise ArgumentError(f"numbers={self.numbers!r} is not valid: choose one of {', '.join(NUMBERS)} "
                                "(--numbers)")
        self.fit.validate()
        self.format.validate()
        return self

    def prepare(self, model: Any, *, means: str | None = None, progress: bool = True,
                batch_size: int = 128) -> Any:
        """The :class:`~circuits.prompts.Prompts`, and for ``means`` (the ablation: ``"cama"`` needs conditional
        means, ``"mean"`` or ``"head"`` plain ones; ``None``: none) the fit set drawn without them. With CAMA,
        prompts reading an entry that the task's fit set cannot give ``fit.min_count`` prompts are set aside (counted in
        ``Prompts.n_dropped_fit``) and replaced by the next ones drawn; ``Prompts.fit`` holds the fit set."""
        from circuits.prompts.fitset import draw_fit_set

        if self.prompts is not None:
            from circuits.prompts.datasets import prepare_dataset_prompts

            return prepare_dataset_prompts(model, self.prompts, self.n_prompts, self.seed, means=means, fit=self.fit,
                                           prepend_bos=self.prepend_bos, numbers=self.numbers, fmt=self.format,
                                           max_checked=self.max_checked, batch_size=batch_size)

        options: dict[str, Any] = {"progress": progress, "prepend_bos": self.prepend_bos, "source": self.source,
                                   "numbers": self.numbers, "fmt": self.format}
        if self.max_checked is not None:
            options["max_checked"] = self.max_checked
        from circuits.tasks import catalogue as tasks

        want, space = self.n_prompts, None
        for _ in range(MAX_REDRAWS + 1):
            drawn = sampling.prepare_prompts(model, self.task, want, self.seed, min_prompts=self.n_prompts, **options)
            if means is None:
                return drawn  # drawn with want == n_prompts
            fit = draw_fit_set(model, self.task, drawn.tokens, self.fit, prepend_bos=self.prepend_bos,
                               batch_size=batch_size, numbers=self.numbers, layout=drawn.layout, fmt=self.format)
            if means == "cama" and fit.whole:  # a small task: score what the rest of its space can back
                keep, fit = split_whole(fit, drawn.tokens, self.n_prompts)
            elif means == "cama":
                keep = fit_covered(fit, drawn.tokens)
            else:
                keep = torch.ones(len(drawn), dtype=torch.bool)
            n_kept = int(keep.sum())
            if n_kept >= self.n_prompts or len(drawn) < want:
                break
            if space is None:  # prompts to draw from: more than that cannot be asked for
                space = (len(tasks.frozen_set(self.task)) if self.source == "frozen"
                         else tasks.operand_space_size(self.task))
            if want >= space:
                break
            want = min(space, want + self.n_prompts - n_kept + max(5, self.n_prompts // 20))  # replace those set aside
        if n_kept < self.n_prompts:
            raise PromptError(
                f"task {self.label!r}: only {n_kept} of the {len(drawn)} correct prompts read means that the fit "
                f"set ({len(fit)} prompts) backs with >= {self.fit.min_count} fit prompts each, "
                f"{self.n_prompts} needed: lower --n-prompts, raise --fit-size or lower --fit-min-count"
            )
        # The fit set excludes every drawn prompt, so it stays disjoint from the kept ones; dropped: the
        # prompts set aside before the last one kept.
        last = int(keep.nonzero().flatten()[self.n_prompts - 1]) + 1
        return replace(drawn.subset(keep, self.n_prompts), fit=fit, n_dropped_fit=int((~keep[:last]).sum()))

    def meta(self) -> dict[str, Any]:
        """The prompts' part of a run's description (``run.json`` / ``summary.json``): the task, the source, and
        how numbers are tokenised and prompts formatted where that is not the papers' default."""
        out: dict[str, Any] = {"task": self.label, "source": "prompts" if self.prompts is not None else self.source}
        if self.numbers != "single":
            out["numbers"] = self.numbers
        if not self.format.zero_shot:
            out["format"] = self.format.identity()
        return out


def fit_covered(fit: FitSet, tokens: Any) -> Any:
    """``[batch]`` bool: which prompts read only ``(position, token)`` entries (positions ``>= 1``) that at
    least ``fit.spec.min_count`` fit prompts hold."""
    from interventions.coverage import entry_counts

    return (entry_counts(fit.tokens, tokens)[:, 1:] >= fit.spec.min_count).all(dim=1)
