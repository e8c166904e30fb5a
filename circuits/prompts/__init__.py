"""Prompts: which prompts a run scores and which it fits its means on.

* :mod:`.spec`: :class:`~circuits.prompts.spec.PromptSpec`, the value a command, a sweep or the API builds;
* :mod:`.sampling`: prompts of a task that a model answers correctly (``prepare_prompts``, ``Prompts``);
* :mod:`.datasets`: prompt datasets (``--prompts`` .jsonl/.csv, a ``datasets.Dataset``) and their fit set
  (``--fit-prompts``); :mod:`.prompt_files`: prompt files read and checked;
* :mod:`.fitset`: the fit set of the means, disjoint from the scored prompts;
* :mod:`.prepared`: a run's prepared prompts kept in its directory and reloaded by a rerun.

May import: :mod:`circuits.tasks`, :mod:`circuits.store`, the package root's errors, input readers
(:mod:`circuits.tasks.inputs`), vocabulary, validation and faithfulness, and :mod:`interventions`; not models'
loading, the runner or the analyses. ``prepare_prompts`` and ``Prompts`` are importable from here, as before the move
(resolved on first use: no torch import until then). """

import importlib
from typing import Any

__all__ = ["MAX_CHECKED", "Prompts", "check_bos", "prepare_prompts", "self_answer_prompts"]


def __getattr__(name: str) -> Any:
    """A public name of :mod:`.sampling` (the former ``circuits.prompts`` module), imported on first use."""
    if not name.startswith("_"):
        sampling = importlib.import_module("circuits.prompts.sampling")
        if hasattr(sampling, name):
            return getattr(sampling, name)
    raise AttributeError(f"module 'circuits.prompts' has no attribute {name!r}")
