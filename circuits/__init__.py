"""Circuit discovery on top of :mod:`interventions`: tasks, model zoo, faithfulness, AF1 search,
head pruning, early decoding, sweeps and the ``af1`` command line.

The public API is importable from here (``from circuits import search_af1, SearchConfig, zoo``); names
are resolved lazily, so ``import circuits`` (and ``af1 --help``) does not import torch.

* analyses: :func:`search_af1` / :class:`SearchConfig`, :func:`necessity_sweep` / :class:`NecessityConfig`,
  :func:`prune_heads` / :class:`PruneConfig`, :func:`early_decode`, :func:`interchange`,
  :func:`faithfulness`, :func:`run_sweep` / :class:`SweepConfig`;
* the runner: :func:`run` (``run(analysis, config, model, prompts, RunOptions(...))``: a :class:`ModelSpec` or a
  :class:`LoadedModel`, a :class:`PromptSpec` or :class:`ReadyPrompts`), the earlier :func:`run_analysis` and
  :func:`execute`, :class:`Analysis` (the contract, :mod:`analyses`), :class:`Run` (see ``docs/architecture.md``);
* data and models: :mod:`tasks`, :mod:`zoo`, :func:`load_model`, :func:`prepare_prompts`;
* errors: :class:`AF1Error` and its subclasses (``docs/reliability.md``).
"""

from __future__ import annotations

import importlib
from typing import Any

from circuits import moved

moved.install()  # former module paths (circuits.task_files, circuits.loading, ...) import with a warning

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "search_af1": "circuits.search", "SearchConfig": "circuits.search", "SearchResult": "circuits.search",
    "ConfigResult": "circuits.search", "SEARCH": "circuits.search",
    "FixedConfig": "circuits.search.fixed", "FIXED": "circuits.search.fixed",
    "necessity_sweep": "circuits.necessity", "NecessityConfig": "circuits.necessity",
    "NecessityResult": "circuits.necessity", "NECESSITY": "circuits.necessity",
    "prune_heads": "circuits.prune", "PruneConfig": "circuits.prune", "PruneResult": "circuits.prune",
    "PRUNE": "circuits.prune",
    "early_decode": "circuits.lens", "interchange": "circuits.lens", "LensResult": "circuits.lens",
    "LensConfig": "circuits.lens.analysis", "LENS": "circuits.lens.analysis",
    "faithfulness": "circuits.faithfulness", "FaithfulnessResult": "circuits.faithfulness",
    "run_sweep": "circuits.sweep", "SweepConfig": "circuits.sweep",
    "execute": "circuits.runner", "Analysis": "circuits.analyses", "Run": "circuits.runner",
    "RunContext": "circuits.analyses", "run_analysis": "circuits.runner",
    "ModelSpec": "circuits.models.spec", "PromptSpec": "circuits.prompts.spec", "run": "circuits.runner",
    "RunOptions": "circuits.options", "LoadedModel": "circuits.models.spec", "ReadyPrompts": "circuits.prompts.ready",
    "load_model": "circuits.models.loading", "prepare_prompts": "circuits.prompts.sampling",
    "Prompts": "circuits.prompts.sampling",
    "AF1Error": "circuits.errors", "ArgumentError": "circuits.errors", "CorruptRunError": "circuits.errors",
    "ModelLoadError": "circuits.errors", "PromptError": "circuits.errors", "RunDirError": "circuits.errors",
    "RunLockedError": "circuits.errors",
    "RunMismatchError": "circuits.errors",
    "SweepResult": "circuits.sweep", "GroundTruthResult": "circuits.groundtruth.report",
    "PromptOutcomes": "circuits.store.outcomes", "prompt_faithfulness": "circuits.faithfulness",
    "load_result": "circuits.results",
}
_SUBMODULES = ("tasks", "prompts", "models", "store", "groundtruth", "zoo", "search", "prune", "lens", "necessity",
               "sweep", "runner", "report", "results", "analyses")

__all__ = sorted([*_EXPORTS, *_SUBMODULES, "__version__"])


_ALIASES = {"load_result": "load"}
"""Exported names spelled differently in their module."""


def __getattr__(name: str) -> Any:
    if f"circuits.{name}" in moved.MOVED:  # a former module: the import warns and returns where it lives now
        return importlib.import_module(f"circuits.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), _ALIASES.get(name, name))
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"circuits.{name}")
    raise AttributeError(f"module 'circuits' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
