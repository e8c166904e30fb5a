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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError, PromptError
from circuits.flags import flag
from circuits.logs import get_logger
from circuits.prompts.fitspec import FitSpec
from circuits.tasks.formats import PromptFormat
from circuits.vocab import NUMBERS, SOURCES

if TYPE_CHECKING:
    from circuits.prompts.fitset import FitSet
    from circuits.prompts.ready import ReadyPrompts

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

    task: Any = field(default=None, metadata=flag(
        "task name (see circuits.tasks.list_tasks()) or the path of a task file (.toml / .json; see docs/tasks.md)"))
    n_prompts: int = field(default=200, metadata=flag(
        "evaluation prompts the model answers correctly, one layout"))
    seed: int = field(default=0, metadata=flag("seed of the prompts and bootstrap CIs"))
    source: str = field(default="build", metadata=flag(
        "prompts generated with --seed (build) or the task's frozen set", choices=SOURCES))
    max_checked: int | None = field(default=None, metadata=flag(
        "most prompts checked with a forward pass while looking for --n-prompts correct ones (default 20000)",
        type=int))
    prepend_bos: bool | None = field(default=None, metadata=flag(
        "put BOS at position 0 (default: the model's own default; CAMA and the search need it, so models that do "
        "not prepend it, e.g. Pythia, need --prepend-bos)", tristate=True))
    fit: FitSpec = field(default_factory=FitSpec)
    numbers: str = field(default="single", metadata=flag(
        "single: every operand and answer one token, as the AF1 papers; multi: several tokens (digit-level "
        "tokenizers such as SmolLM2, Qwen2, Gemma), answers read under teacher forcing", choices=NUMBERS))
    format: PromptFormat = field(default_factory=PromptFormat)
    prompts: Any = field(default=None, metadata=flag(
        "instead of --task: a prompt dataset, .jsonl or .csv with columns prompt and answer (see docs/tasks.md); "
        "means are fitted on its other rows"))

    @property
    def spec(self) -> PromptSpec:
        """Itself: the prompt spec the prompts come from (as :attr:`ReadyPrompts.spec
        <circuits.prompts.ready.ReadyPrompts.spec>` says of prepared ones)."""
        return self

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
        ``Prompts.n_dropped_fit``) and replaced by the next ones drawn; ``Prompts.fit`` holds the fit set. Prompts an
        earlier command prepared and checked on the same model under the same spec are reloaded from the user's
        results cache instead (:func:`circuits.prompts.prepared.cached`)."""
        import torch

        from circuits.prompts import prepared, sampling
        from circuits.prompts.fitset import draw_fit_set, split_whole
        from circuits.store import usercache

        if usercache.limit_bytes() > 0:
            found = prepared.cached(prepared.spec_key(model, self, means))
            if found is not None:
                return replace(found.prompts, extra={**found.prompts.extra, prepared.EXTRA: found})

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

    def ready(self, model: Any, *, name: str | None, means: str | None, out: str | Path | None = None,
              progress: bool = True, batch_size: int = 128) -> ReadyPrompts:
        """These prompts, ready for the runner: :meth:`prepare`d with the fit set of ``means``, or reloaded from the
        run directory ``out`` when an earlier run prepared them there under the same key
        (:func:`circuits.prompts.prepared.prepare`); says what it uses (the ``circuits.runner`` logger), naming the
        model ``name``."""
        from circuits.prompts import prepared
        from circuits.prompts.ready import ReadyPrompts

        prompts = prepared.prepare(self, model, means=means, out=out, progress=progress, batch_size=batch_size)
        kept = prepared.prepared_of(prompts)
        lines = []
        if kept is not None and kept.source is not None and kept.source.parent == Path(str(out)):
            lines.append(f"prompts and fit set: reloaded from {kept.source} (prepared by an earlier run of this "
                         f"command)")  # from the results cache: prepared.cached says so
        lines.append(f"{name} on {self.label}: base accuracy {prompts.base_accuracy:.1%} ({prompts.n_correct}/"
                     f"{prompts.n_checked} checked prompts); using {len(prompts)} prompts of "
                     f"{prompts.tokens.shape[1]} tokens ({prompts.n_layouts} layout(s))")
        if prompts.fit is not None:
            fit = prompts.fit
            how = "the whole layout" if fit.whole else f"a sample (seed {fit.spec.seed})"
            dropped = (f"; {prompts.n_dropped_fit} correct prompt(s) set aside: a mean they read has fewer than "
                       f"{fit.spec.min_count} fit prompts" if prompts.n_dropped_fit else "")
            lines.append(f"means: fitted on {len(fit)} prompts of {self.label} ({how}, population "
                         f"{fit.spec.population}), none of them scored{dropped}")
        get_logger("runner").info("\n".join(lines))
        return ReadyPrompts.of(prompts, self)

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
