"""Prompt formats for small and instruct models: solved examples before the query, and the chat template.

The AF1 papers prompt zero-shot (:class:`PromptFormat` at its defaults: the task's template alone). A weak
model answers far more prompts with a few solved examples before the query (SmolLM2-135M on single-digit
sums: 5.5% zero-shot, 47% with two), and an instruct model may expect its chat template:

* ``shots = K``: the first ``K`` prompts of the task drawn with ``examples_seed`` (never a query: prompts with
  their operands are left out of what is drawn), each followed by its answer and ``separator``, before the
  query: ``2+3=5\\n1+4=5\\n{query}``;
* ``chat``: the (prefixed) query as the user's message in the tokenizer's chat template, with the
  assistant's turn opened (``add_generation_prompt``); the answer is the assistant's first tokens. The
  template brings its own start token, so no BOS is prepended (position 0 still holds the BOS id where the
  template starts with it, as SmolLM2's ``<|im_start|>`` does).

The prefix is the same in every prompt, so it is part of the layout: its positions hold fixed tokens,
whose states depend on nothing that varies, and CAMA leaves them unchanged. ``run.json`` records the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError
from circuits.flags import flag

if TYPE_CHECKING:
    from circuits.tasks.catalogue import TaskLike
    from interventions.types import JsonDict, JsonMapping, Model, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

__all__ = ["EXAMPLES_SEED", "PromptFormat", "describe_prompts", "own_format"]

EXAMPLES_SEED = 20_251_202
"""Seed of the solved examples' draw (fixed: the examples are part of the format, not of a run's seed)."""


@dataclass(frozen=True)
class PromptFormat:
    """How a task's prompt is presented (see the module docstring): ``shots`` solved examples (>= 0), joined
    and ended by ``separator``, and ``chat`` (the tokenizer's chat template)."""

    shots: int = field(default=0, metadata=flag(
        "solved examples of the task before each prompt (0: zero-shot, as the papers)"))
    chat: bool = field(default=False, metadata=flag(
        "wrap each prompt in the tokenizer's chat template (instruct models)"))
    separator: str = "\n"
    examples_seed: int = EXAMPLES_SEED

    def validate(self) -> PromptFormat:
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or not 0 <= self.shots <= 64:
            raise ArgumentError(f"shots={self.shots!r} must be an integer in 0..64 (--shots)")
        if not isinstance(self.chat, bool):
            raise ArgumentError(f"chat={self.chat!r} must be true or false (--chat)")
        if not isinstance(self.separator, str):
            raise ArgumentError(f"separator={self.separator!r} must be a string")
        return self

    @property
    def zero_shot(self) -> bool:
        """Whether this is the papers' format: the template alone, no chat template."""
        return self.shots == 0 and not self.chat

    def identity(self) -> JsonDict:
        return {"shots": self.shots, "chat": self.chat, "separator": self.separator,
                "examples_seed": self.examples_seed}

    def describe(self) -> str:
        """``"zero-shot"``, ``"2-shot"``, ``"2-shot, chat template"``."""
        return ("zero-shot" if self.shots == 0 else f"{self.shots}-shot") + (", chat template" if self.chat else "")

    def examples(self, task: TaskLike) -> list[JsonDict]:
        """The solved examples: ``{"prompt", "answer", "answer_text", "operands"}`` rows of ``task`` (a name, task
        file or spec); ``prompt`` without the task's own ``prefix``, ``answer_text`` as written after it."""
        from circuits.tasks import catalogue as tasks
        from circuits.tasks.tokens import answer_string, answer_texts_of, answer_value

        if not self.shots:
            return []
        spec = tasks.get_task(task)
        ds = tasks.build_task(spec, n=self.shots, seed=self.examples_seed)
        return [{"prompt": p[len(spec.prefix):], "answer": answer_value(a), "answer_text": answer_string(t),
                 "operands": list(o)}
                for p, a, t, o in zip(ds["prompt"], ds["answer"], answer_texts_of(ds), ds["operands"])]

    def prefix(self, task: TaskLike) -> str:
        """The text before every query (``""`` without shots): the task's own prefix, then the solved examples."""
        from circuits.tasks import catalogue as tasks

        own = tasks.get_task(task).prefix
        return own + "".join(f"{e['prompt']}{e['answer_text']}{self.separator}" for e in self.examples(task))

    def prepend_bos(self, prepend_bos: bool | None) -> bool | None:
        """BOS for prompts of this format: none with the chat template (it brings its own start token)."""
        return False if self.chat and prepend_bos is None else prepend_bos

    def apply(self, ds: Dataset, task: TaskLike, model_or_tokenizer: Model | Tokenizer) -> Dataset:
        """``ds`` (rows of :func:`circuits.tasks.build_task`) in this format, without the rows whose operands
        are those of a solved example; the zero-shot format returns ``ds`` itself."""
        if self.zero_shot:
            return ds
        from circuits.tasks import catalogue as tasks
        from circuits.tasks.tokens import tokenizer_of
        from datasets import Dataset

        shown = {tuple(e["operands"]) for e in self.examples(task)}
        rows = ds.to_dict()
        keep = [i for i, ops in enumerate(rows["operands"]) if tuple(ops) not in shown]
        prefix, own = self.prefix(task), len(tasks.get_task(task).prefix)
        prompts = [prefix + rows["prompt"][i][own:] for i in keep]
        if self.chat:
            tok = tokenizer_of(model_or_tokenizer)
            if getattr(tok, "chat_template", None) is None:
                raise ArgumentError("--chat: this model's tokenizer has no chat template; drop --chat")
            prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        cols = {c: [v[i] for i in keep] for c, v in rows.items()}
        cols["prompt"] = prompts
        return Dataset.from_dict(cols)


def describe_prompts(meta: JsonMapping, task: TaskLike | None = None) -> str:
    """How a run's prompts were presented, for its report and tables, from its description (``run.json``,
    ``summary.json`` or a command's meta: the ``format`` and ``numbers`` keys of
    :meth:`circuits.prompts.spec.PromptSpec.meta`, absent at the papers' defaults) and its task (``task``, else
    ``meta["task"]``), whose file may set a ``prefix`` and an ``answer_format`` of its own: ``"zero-shot,
    single-token numbers (the AF1 papers' format)"``, ``"2-shot, chat template, numbers of several tokens
    (answers read under teacher forcing)"``, ``"zero-shot after the task file's prefix, answers written as
    ' {}', single-token numbers"``. The papers' format is named only where nothing differs from it."""
    given = meta.get("format") or {}
    fmt = PromptFormat(shots=int(given.get("shots", 0)), chat=bool(given.get("chat", False)))
    prefix, answer_format = own_format(meta.get("task") if task is None else task)
    text = fmt.describe() + (" after the task file's prefix" if prefix else "")
    if answer_format != "{}":
        text += f", answers written as {answer_format!r}"
    if meta.get("numbers", "single") == "multi":
        return text + ", numbers of several tokens (answers read under teacher forcing)"
    papers = fmt.zero_shot and not prefix and answer_format == "{}"
    return text + ", single-token numbers" + (" (the AF1 papers' format)" if papers else "")


def own_format(task: TaskLike | None) -> tuple[str, str]:
    """``(prefix, answer_format)`` of a task (name, file path or spec): what its file says about the prompt's
    text besides the template; ``("", "{}")`` for ``None``, a caller's own prompts or a task that no longer
    resolves (a moved task file: a report still renders)."""
    from circuits.tasks import catalogue as tasks

    if task is None or not tasks.known_task(task):
        return "", "{}"
    try:
        spec = tasks.get_task(task)
    except (ArgumentError, OSError, ValueError):
        return "", "{}"
    return spec.prefix, spec.answer_format
