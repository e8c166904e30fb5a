"""The analysis contract (:class:`Analysis`), what the runner hands an analysis (:class:`RunContext`, a
:class:`ResultStore`) and the registry of analyses by name.

An analysis is pure: ``run(model, config, ctx) -> result`` opens no file. Everything the runner
(:mod:`circuits.runner`) and the sweep (:mod:`circuits.sweep`) need to know about it is one
``Analysis[C, R]`` value, typed by its config ``C`` (a frozen dataclass, :class:`AnalysisConfig`) and its
result ``R``: its identity, its record schema, its outputs (``write``), the means it needs, how a sweep
cell builds its config (``configure``) and the row a sweep table shows for its result (``summary_row``).

A new analysis is one module defining such a value plus one command module (and one line in :data:`REGISTRY`
for the sweep, or :func:`register` at run time); the runner, the sweep, loading and the zoo stay as they are.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch
from jaxtyping import Bool, Int

import interventions as iv
from circuits.errors import ArgumentError
from circuits.prompts.fitset import FitSet
from circuits.store.records import RecordSchema
from interventions.coverage import Coverage
from interventions.types import JsonDict, JsonMapping, Model, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from circuits.prompts.spec import PromptSpec
    from circuits.store.runs import RunDir
    from interventions.adapter import ModelInfo

__all__ = ["REGISTRY", "Analysis", "AnalysisConfig", "Checkpoints", "DirStore", "MemoryStore", "NoCheckpoints",
           "ResultStore", "RunContext", "configured", "get", "names", "register", "unregister"]


class AnalysisConfig(Protocol):
    """What the runner needs of an analysis's config: a frozen dataclass with ``batch_size`` (prompts per
    forward pass, replaced by the runner for ``--batch-size auto``) and ``validate`` (raise
    :class:`~circuits.errors.ArgumentError` naming the first bad field; ``info``: the model's
    :class:`~interventions.ModelInfo`, or ``None`` before loading). ``validate`` is the one check of the
    config's values: the runner does not check them again."""

    @property
    def batch_size(self) -> int: ...

    def validate(self, info: Any, /) -> object: ...  # a ModelInfo, None, or what the config's own check takes


C = TypeVar("C", bound=AnalysisConfig)
R = TypeVar("R")


class ResultStore(Protocol):
    """Where an analysis keeps the records it has finished, so that a rerun resumes.

    ``records()`` returns the finished records (validated); ``append(record)`` persists one at once.
    """

    def records(self) -> list[JsonDict]: ...

    def append(self, record: JsonMapping) -> None: ...


class MemoryStore:
    """A :class:`ResultStore` in memory (no output directory)."""

    def __init__(self) -> None:
        self.rows: list[JsonDict] = []

    def records(self) -> list[JsonDict]:
        return list(self.rows)

    def append(self, record: JsonMapping) -> None:
        self.rows.append(dict(record))


class DirStore:
    """A :class:`ResultStore` backed by a run directory's JSONL results file, validated on read."""

    def __init__(self, run_dir: RunDir, schema: RecordSchema | None):
        self.run_dir = run_dir
        numbered = run_dir.load_numbered_records()
        self.loaded = schema.validate(run_dir.results_path, numbered) if schema else [r for _, r in numbered]

    def records(self) -> list[JsonDict]:
        return list(self.loaded)

    def append(self, record: JsonMapping) -> None:
        self.run_dir.append(record)


class Checkpoints(Protocol):
    """Where an analysis keeps the partial state of a long step (sums over the batches done so far), so that a
    killed run resumes it: ``load(name)`` returns the bytes last kept under ``name`` (``None``: none), ``keep(name,
    data)`` replaces them whole. The runner's are bound to the run's identity (a run directory's checkpoint files,
    :mod:`circuits.store.checkpoints`) or keep nothing (:class:`NoCheckpoints`, without an output directory)."""

    def load(self, name: str) -> bytes | None: ...

    def keep(self, name: str, data: bytes) -> None: ...


class NoCheckpoints:
    """:class:`Checkpoints` that keep nothing (a run without an output directory)."""

    def load(self, name: str) -> bytes | None:
        return None

    def keep(self, name: str, data: bytes) -> None:
        """Nothing to keep."""


@dataclass
class RunContext:
    """What the runner hands an analysis besides the model and the config.

    ``tokens``/``answers``: the base-correct prompts (``[n, pos]`` / ``[n]``, or ``[n, k]`` for answers of
    ``k`` tokens); ``n_given``: prompts before that filter; ``given_tokens``/``given_answers``: all of them;
    ``keep``: ``[n_given]`` bool, which were kept; ``prompts``: caller records aligned with the *given*
    prompts (or ``None``); ``cache``: the means cache (or ``None``); ``store``: finished records;
    ``progress``: show bars; ``checkpoints``: where partial state is kept between batches (:class:`Checkpoints`);
    ``meta``: the caller's description (model, task, source, command); ``spec``:
    the :class:`~circuits.prompts.spec.PromptSpec` the prompts were prepared from (``None`` for the caller's own
    tensors); ``started``: when the run began (``time.time()``).
    """

    tokens: Int[torch.Tensor, "n pos"]
    answers: Int[torch.Tensor, " n *k"]
    n_given: int
    keep: Bool[torch.Tensor, " n_given"]
    given_tokens: Int[torch.Tensor, "n_given pos"]
    given_answers: Int[torch.Tensor, " n_given *k"]
    cache: iv.MeanCache | None
    store: ResultStore
    progress: bool
    meta: JsonDict = field(default_factory=dict)
    prompts: Sequence[JsonMapping] | None = None
    fit: FitSet | None = None
    coverage: Coverage | None = None
    means_identity: JsonDict | None = None
    tokenizer: Tokenizer | None = None
    spec: PromptSpec | None = None
    started: float = field(default_factory=time.time)
    checkpoints: Checkpoints = field(default_factory=NoCheckpoints)

    def means_summary(self) -> JsonDict | None:
        """What ``summary.json`` says of the means (``None`` without): the fit set (how it was drawn, its
        size and hash) and the fit counts behind the means the scored prompts read."""
        if self.cache is None or self.coverage is None:
            return None
        return {**(self.means_identity or {}), "coverage": self.coverage.summary(self.tokenizer)}

    def means_note(self) -> str | None:
        """One line for a report: the fit set and its counts (``None`` without means)."""
        if self.coverage is None:
            return None
        fit = self.fit
        how = ("the caller's cache" if fit is None else
               f"{len(fit)} fit prompts ({'the whole layout' if fit.whole else 'a sample'} of task {fit.task}, "
               f"population {fit.spec.population}, seed {fit.spec.seed})"
               if fit.task else f"{len(fit)} given fit prompts")
        return f"Means: {how}, none of them scored; {self.coverage.line()}."

    @property
    def kept_prompts(self) -> list[JsonDict] | None:
        """The caller's prompt records of the kept prompts (``None`` without records)."""
        if self.prompts is None:
            return None
        return [dict(p) for p, k in zip(self.prompts, self.keep.tolist()) if k]


def validate_config(config: AnalysisConfig, info: ModelInfo) -> None:
    """The default :attr:`Analysis.validate`: ``config.validate(info)``."""
    config.validate(info)


def no_means(config: object) -> str | None:
    """The default :attr:`Analysis.means`: none."""
    return None


def no_schema(config: object, info: ModelInfo, n_prompts: int) -> RecordSchema | None:
    return None


def no_prompt_records(ctx: RunContext) -> list[JsonDict] | None:
    return None


def no_row(result: object) -> JsonDict:
    """The default :attr:`Analysis.summary_row`: nothing beyond the cell's prompts."""
    return {}


@dataclass(frozen=True)
class Analysis(Generic[C, R]):
    """An analysis as the runner and the sweep see it, typed by its config ``C`` and its result ``R``.

    ``name``: the command (``"search"``); ``config_type``: ``C`` (a frozen dataclass);
    ``results_file``: its JSONL results (``None``: no resumable records); ``identity(config, ctx, model)``:
    the run identity (what determines the results); ``run(model, config, ctx) -> R``: the pure analysis;
    ``write(result, run_dir, ctx)``: its outputs (summary and report); ``validate(config, info)``: raise on a
    config that does not fit the model (default: ``config.validate(info)``); ``means(config)``: the means it
    needs (``"cama"``: conditional, ``"mean"``/``"head"``: plain, ``None``: none; :func:`circuits.vocab.means_kind`);
    ``schema(config, info, n_prompts)``: the records' schema (default: none); ``prompt_records(ctx)``: the
    ``prompts.jsonl`` records (``None``: none); ``summary_row(result)``: what a sweep's table shows of a
    result (keys of :class:`circuits.sweep.CellResult`: ``wait``, ``transfer``, ``faithfulness``, ``ci_low``,
    ``ci_high``, ``selected``, ``faith_by_wait``); ``configure(settings)``: the config of a sweep cell from the
    sweep's settings (default: the fields of ``config_type`` that ``settings`` names);
    ``base_correct_only``: run on the prompts the unmodified model answers correctly (``False``: on all).
    ``optional_identity``: identity keys compared only when both the directory's ``run.json`` and this run
    hold them (besides :data:`circuits.runner.LABELS`; keys earlier releases recorded that no longer
    determine the results).
    """

    name: str
    config_type: type[C]
    results_file: str | None
    identity: Callable[[C, RunContext, Model], JsonDict]
    run: Callable[[Model, C, RunContext], R]
    write: Callable[[R, RunDir, RunContext], None]
    validate: Callable[[C, ModelInfo], None] = validate_config
    means: Callable[[C], str | None] = no_means
    schema: Callable[[C, ModelInfo, int], RecordSchema | None] = no_schema
    prompt_records: Callable[[RunContext], list[JsonDict] | None] = no_prompt_records
    summary_row: Callable[[R], JsonDict] = no_row
    configure: Callable[[JsonMapping], C] | None = None
    base_correct_only: bool = True
    optional_identity: tuple[str, ...] = ()

    def needs_means(self, config: C) -> bool:
        """Whether ``config`` needs a :class:`~interventions.MeanCache`."""
        return self.means(config) is not None

    def conditional_means(self, config: C) -> bool:
        """Whether the means are conditional (CAMA: per ``(position, token)``) rather than per position."""
        return self.means(config) == "cama"

    def config_for(self, settings: JsonMapping) -> C:
        """The config of a sweep cell: :attr:`configure`, or the fields of :attr:`config_type` that ``settings``
        names (validated by the runner against the model, :attr:`validate`)."""
        if self.configure is not None:
            return self.configure(settings)
        names = {f.name for f in dataclasses.fields(self.config_type)}  # type: ignore[arg-type]
        return self.config_type(**{k: v for k, v in settings.items() if k in names})


def configured(config_type: type[C], config: C | None, **fields: object) -> C:
    """``config`` (default: ``config_type(**fields)``) with the ``fields`` that are not ``None`` replaced: how an entry
    point such as :func:`circuits.search.search_af1` takes ``config=`` and, as before, the config's fields as
    keywords (which override those of ``config``)."""
    given = {k: v for k, v in fields.items() if v is not None}
    if config is None:
        return config_type(**given)
    if not isinstance(config, config_type):
        raise ArgumentError(f"config={config!r} is not a {config_type.__name__}")
    return dataclasses.replace(config, **given) if given else config  # type: ignore[type-var]


REGISTRY: dict[str, str] = {
    "search": "circuits.search.analysis:SEARCH",
    "fixed": "circuits.search.fixed:FIXED",
    "necessity": "circuits.necessity:NECESSITY",
    "prune": "circuits.prune.greedy:PRUNE",
    "lens": "circuits.lens.analysis:LENS",
    "edges": "circuits.edges.analysis:EDGES",
}
"""Every analysis by name, as ``module:attribute`` (imported when first asked for). Add an analysis with one
line here (or :func:`register` at run time)."""

_LOADED: dict[str, Analysis[Any, Any]] = {}


def register(analysis: Analysis[Any, Any]) -> Analysis[Any, Any]:
    """Make ``analysis`` known by its name (a sweep cell can then run it); returns it."""
    _LOADED[analysis.name] = analysis
    return analysis


def unregister(name: str) -> None:
    """Forget an analysis :func:`register` added (the ones of :data:`REGISTRY` stay)."""
    _LOADED.pop(name, None)


def names() -> list[str]:
    """The names of the registered analyses."""
    return sorted(set(REGISTRY) | set(_LOADED))


def get(name: str) -> Analysis[Any, Any]:
    """The analysis registered as ``name``; :class:`~circuits.errors.ArgumentError` naming the known ones."""
    if name not in _LOADED:
        if name not in REGISTRY:
            raise ArgumentError(f"analysis {name!r} is unknown; known: {', '.join(names())}")
        module, attr = REGISTRY[name].split(":")
        _LOADED[name] = getattr(importlib.import_module(module), attr)
    return _LOADED[name]
