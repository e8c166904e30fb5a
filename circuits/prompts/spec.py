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
    from circuits.prompts.prompt_files import PromptData
    from circuits.prompts.ready import ReadyPrompts
    from circuits.prompts.sampling import Prompts
    from circuits.tasks.catalogue import TaskLike
    from interventions.types import JsonDict, Model

__all__ = ["MAX_REDRAWS", "PromptSpec", "check_prompt_count", "dropped_line", "fit_covered"]

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

    task: TaskLike | None = field(default=None, metadata=flag(
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
    prompts: PromptData | None = field(default=None, metadata=flag(
        "instead of --task: a prompt dataset, .jsonl or .csv with columns prompt and answer (see docs/tasks.md); "
        "means are fitted on its other rows"))
    fit_prompts: TaskLike | PromptData | None = field(default=None, metadata=flag(
        "with --prompts: the means' own fit set, a prompts file (.jsonl or .csv, the columns of --prompts) or a task "
        "(a task file or catalogue name) whose prompts the fit set is drawn from; default: the other rows of "
        "--prompts"))

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
        if self.fit_prompts is not None and self.prompts is None:
            raise ArgumentError("--fit-prompts (fit_prompts=) gives the means of a prompt dataset (--prompts) their "
                                "own fit set; a task draws its fit set itself: drop --fit-prompts or use --prompts")
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

    def prepare(self, model: Model, *, means: str | None = None, progress: bool = True,
                batch_size: int = 128) -> Prompts:
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
                                           max_checked=self.max_checked, batch_size=batch_size,
                                           fit_source=self.fit_prompts)

        options: JsonDict = {"progress": progress, "prepend_bos": self.prepend_bos, "source": self.source,
                                   "numbers": self.numbers, "fmt": self.format}
        if self.max_checked is not None:
            options["max_checked"] = self.max_checked
        from circuits.tasks import catalogue as tasks

        if self.task is None:
            raise ArgumentError(ONE_SOURCE)
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

    def ready(self, model: Model, *, name: str | None, means: str | None, out: str | Path | None = None,
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
        if prompts.n_dropped_multi_token:
            lines.append(dropped_line(prompts, self.numbers))
        if prompts.fit is not None:
            fit = prompts.fit
            how = "the whole layout" if fit.whole else f"a sample (seed {fit.spec.seed})"
            dropped = (f"; {prompts.n_dropped_fit} correct prompt(s) set aside: a mean they read has fewer than "
                       f"{fit.spec.min_count} fit prompts" if prompts.n_dropped_fit else "")
            lines.append(f"means: fitted on {len(fit)} prompts of {fit.task or self.label} ({how}, population "
                         f"{fit.spec.population}), none of them scored{dropped}")
        get_logger("runner").info("\n".join(lines))
        return ReadyPrompts.of(prompts, self)

    def meta(self) -> JsonDict:
        """The prompts' part of a run's description (``run.json`` / ``summary.json``): the task, the source, and
        how numbers are tokenised and prompts formatted where that is not the papers' default."""
        out: JsonDict = {"task": self.label, "source": "prompts" if self.prompts is not None else self.source}
        if self.numbers != "single":
            out["numbers"] = self.numbers
        if not self.format.zero_shot:
            out["format"] = self.format.identity()
        return out


def dropped_line(prompts: Any, numbers: str) -> str:
    """What the drawn prompts that were never scored say: how many of the drawn ones, why, and how to draw only
    prompts the tokenizer reads (``numbers``: ``--numbers``)."""
    n, drawn = prompts.n_dropped_multi_token, prompts.n_drawn
    what = "a single token" if numbers == "single" else "tokens this tokenizer reads"
    return (f"dropped {n:,} of the {drawn:,} drawn prompts before scoring: an operand or the answer is not {what} "
            f"of this model's tokenizer (--numbers {numbers}); to draw only prompts it reads, bound the answer "
            f"(answer_min/answer_max in a task file) or the slots' ranges")


def fit_covered(fit: FitSet, tokens: Any) -> Any:
    """``[batch]`` bool: which prompts read only ``(position, token)`` entries (positions ``>= 1``) that at
    least ``fit.spec.min_count`` fit prompts hold."""
    from interventions.coverage import entry_counts

    return (entry_counts(fit.tokens, tokens)[:, 1:] >= fit.spec.min_count).all(dim=1)


def check_prompt_count(task: Any, n_prompts: int, source: str = "build", shots: int = 0,
                       flag: str = "--n-prompts") -> None:
    """:class:`~circuits.errors.ArgumentError`, before any model loads, when ``task`` cannot give ``n_prompts``
    prompts: more than its distinct prompts (``source="build"``; the ``shots`` solved examples are never queries,
    so they are not counted) or more than the rows of its frozen set (``source="frozen"``). ``flag`` names the
    setting in the message (``"sweep key n_prompts"``)."""
    from circuits.tasks import catalogue as tasks

    spec, label = tasks.get_task(task), tasks.task_label(task)
    if source == "frozen":
        path = tasks.frozen_path(spec)
        if not path.is_file():
            return  # said by the caller's check of the frozen set, or by the run
        rows = len(tasks.read_frozen(path, spec.n_operands))  # read and checked: one line naming the file and line
        if n_prompts > rows:
            raise ArgumentError(f"{flag} {n_prompts} exceeds the {rows} prompts of task {label!r}'s frozen set "
                                f"({path.name}); give at most {rows}, or --source build")
        return
    size = tasks.operand_space_size(spec)
    if shots and shots >= size:
        raise ArgumentError(f"--shots {shots} needs more solved examples than task {label!r} has distinct prompts "
                            f"({size}), leaving none to ask: give --shots {max(0, size - 1)} or fewer")
    if n_prompts > size - shots:
        extra = f" less the {shots} solved examples of --shots" if shots else ""
        raise ArgumentError(f"{flag} {n_prompts} exceeds the {size} distinct prompts of task {label!r}{extra}; "
                            f"give at most {size - shots}")
