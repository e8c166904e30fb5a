"""The grid of an ``af1 sweep``: models x tasks x ablations x seeds, read from TOML or flags.

A sweep config is a TOML file with one ``[sweep]`` table::

    [sweep]
    models = ["arith-styles"]          # zoo names or pretrained names
    tasks = ["add", "sub", "style"]    # task names, a group ("original", "style", "early_decoding", "digits")
                                       # or task files ("mul.toml": relative to the config's folder)
    ablations = ["cama"]               # cama, mean, zero
    seeds = [42, 123, 999]
    n_prompts = 200
    mode = "fixed"                     # "search" (full search per cell) or "fixed" (one configuration)
    wait = 2                           # fixed mode: the configuration
    transfer = 1
    necessity = false                  # also run the necessity sweep per (model, task, seed)
    lens = false                       # also run early decoding per (model, task, seed)

Optional keys: ``analyses`` (further registered analyses, :mod:`circuits.analyses`, each run once per
(model, task, seed) like ``necessity`` and ``lens``, e.g. ``["necessity"]``), ``threshold`` (0.9), ``grid``
(``"full"``), ``source`` (``"build"``), ``batch_size``
(128), ``device`` (``"cpu"``), ``backend``, ``dtype``, ``device_map`` (``"auto"``, ``"balanced"``,
``"sequential"``: a large model over several GPUs) and ``max_memory`` (``"0=70GiB,1=70GiB"`` or a table
``{0 = "70GiB", 1 = "70GiB"}``; needs ``device_map``), see :mod:`circuits.models.placement`; ``remote``
(``false``; ``true`` with ``backend = "nnsight"`` runs on NDIF, see ``docs/remote.md``); the fit set of the
means: ``fit_size`` (10000), ``fit_min_count`` (5), ``fit_seed`` (0), ``fit_population`` (``"all"``), see
:mod:`circuits.prompts.fitset`; the prompts: ``numbers`` (``"single"`` or ``"multi"``, :mod:`circuits.tasks.digits`),
``shots`` (0) and ``chat`` (``false``), :mod:`circuits.tasks.formats`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError, did_you_mean
from circuits.models import placement
from circuits.prompts.fitset import DEFAULT_MIN_COUNT, DEFAULT_SIZE, FitSpec
from circuits.sweep.types import check_types
from circuits.validation import check_choice
from circuits.vocab import ABLATIONS, GRIDS
from interventions.types import JsonDict, JsonMapping

if TYPE_CHECKING:
    from circuits.models.spec import ModelSpec
    from circuits.prompts.spec import PromptSpec

MODES = ("search", "fixed")
GROUPS = ("original", "style", "early_decoding", "digits")


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: the registered analysis it runs (:mod:`circuits.analyses`: ``"search"`` or
    ``"fixed"``, the sweep's mode, for the ablations; another, e.g. ``"necessity"`` or ``"lens"``, once per
    model, task and seed) and ``ablation``: the ablation of a search or fixed cell, else the analysis's name
    (its column in the table and its folder)."""

    model: str
    task: str
    ablation: str
    seed: int
    analysis: str = "search"

    @property
    def kind(self) -> str:
        """The analysis the cell runs (:attr:`analysis`)."""
        return self.analysis

    def folder(self) -> Path:
        """The cell's run directory below the sweep's ``cells/``."""
        return Path(slug(self.model)) / task_slug(self.task) / f"{self.ablation}-seed{self.seed}"


def slug(name: str) -> str:
    """A model name as one folder name (``meta-llama/Meta-Llama-3-8B`` -> ``meta-llama__Meta-Llama-3-8B``)."""
    return name.replace("/", "__")


def config_tasks(sweep: JsonDict, path: Path) -> JsonDict:
    """The ``[sweep]`` table of the config file ``path`` with its task files relative to the file's folder
    (``tasks = ["mul.toml"]`` beside the config) made paths from here; other tasks as they are."""
    if isinstance(sweep.get("tasks"), list):
        here = path.parent
        sweep["tasks"] = [str(here / t) if isinstance(t, str) and t.lower().endswith((".toml", ".json"))
                          and not Path(t).is_absolute() and (here / t).exists() else t for t in sweep["tasks"]]
    return sweep


def task_slug(task: str) -> str:
    """A task as one folder name: a catalogue name as it is, a task file by its stem (``tasks/mul.toml`` -> ``mul``)."""
    from circuits.tasks import catalogue as tasks

    return Path(task).stem if tasks.task_path(task) is not None else task


@dataclass(frozen=True)
class SweepConfig:
    """The sweep's grid and settings (see the module docstring for every field)."""

    models: tuple[str, ...]
    tasks: tuple[str, ...]
    ablations: tuple[str, ...] = ("cama",)
    seeds: tuple[int, ...] = (0,)
    n_prompts: int = 200
    mode: str = "search"
    wait: int | None = None
    transfer: int | None = None
    threshold: float = 0.9
    grid: str = "full"
    source: str = "build"
    necessity: bool = False
    lens: bool = False
    analyses: tuple[str, ...] = ()
    batch_size: int = 128
    device: str = "cpu"
    backend: str | None = None
    dtype: str | None = None
    device_map: str | None = None
    max_memory: Any = None
    remote: bool = False
    fit_size: int = DEFAULT_SIZE
    fit_min_count: int = DEFAULT_MIN_COUNT
    fit_seed: int = 0
    fit_population: str = "all"
    numbers: str = "single"
    shots: int = 0
    chat: bool = False
    extra: JsonDict = field(default_factory=dict, compare=False)

    @classmethod
    def from_mapping(cls, raw: JsonMapping) -> SweepConfig:
        """A config from the ``[sweep]`` table (task groups expanded); unknown keys are refused."""
        from circuits.tasks import catalogue

        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ArgumentError(f"unknown sweep key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        check_types(raw)  # before anything is built: circuits.sweep.types
        for key in ("models", "tasks"):
            if key not in raw:
                raise ArgumentError(f"the sweep config needs `{key} = [...]`")
        values = dict(raw)
        for key in ("models", "tasks", "ablations", "seeds", "analyses"):
            if key in values:
                if isinstance(values[key], (str, int)):
                    values[key] = [values[key]]
                if not isinstance(values[key], (list, tuple)) or not values[key]:
                    raise ArgumentError(f"sweep key `{key}` must be a non-empty list")
                values[key] = tuple(values[key])
        expanded: list[str] = []
        for t in values["tasks"]:
            group = [n for n in catalogue.list_tasks() if catalogue.get_task(n).group == t] if t in GROUPS else [t]
            expanded += [n for n in group if n not in expanded]
        values["tasks"] = tuple(expanded)
        return cls(**values).validate()

    @classmethod
    def from_toml(cls, path: str | Path) -> SweepConfig:
        """Read ``path`` (a TOML file with a ``[sweep]`` table)."""
        from circuits.tasks.files import toml_module
        from circuits.tasks.package_data import find_file

        tomllib = toml_module()
        path = find_file(path)
        try:
            raw = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ArgumentError(f"--config {path} is not valid TOML: {err}") from None
        if "sweep" not in raw or not isinstance(raw["sweep"], dict):
            raise ArgumentError(f"--config {path} has no [sweep] table")
        return cls.from_mapping(config_tasks(dict(raw["sweep"]), path))

    def validate(self) -> SweepConfig:
        """Raise :class:`ArgumentError` naming the first bad field (checks that need no model)."""
        from circuits.tasks import catalogue

        if self.mode not in MODES:
            raise ArgumentError(f"mode={self.mode!r} is not valid: choose 'search' or 'fixed'")
        if self.mode == "fixed" and (self.wait is None or self.transfer is None):
            raise ArgumentError("mode='fixed' needs wait and transfer (the configuration to apply to every cell)")
        if self.mode == "search" and (self.wait is not None or self.transfer is not None):
            raise ArgumentError("wait/transfer apply to mode='fixed' only; mode='search' selects them per cell")
        for task in self.tasks:
            if catalogue.task_path(task) is not None:
                catalogue.load_task(task)  # one line naming the file and the field
            elif task not in catalogue.list_tasks():
                known = catalogue.list_tasks()
                raise ArgumentError(f"task {task!r} is unknown; {did_you_mean(task, [*known, *GROUPS])}known: "
                                    f"{', '.join(known)}, a group "
                                    f"({', '.join(GROUPS)}) or a task file (.toml / .json)")
        folders = [task_slug(t) for t in self.tasks]
        if len(set(folders)) != len(folders):
            twice = next(f for f in folders if folders.count(f) > 1)
            raise ArgumentError(f"tasks: two tasks would share the cell folder {twice!r}: rename one task file")
        for ablation in self.ablations:
            check_choice("ablation", ablation, ABLATIONS)
        check_choice("sweep key grid", self.grid, GRIDS)
        if self.analyses:
            from circuits import analyses

            for name in self.analyses:
                if name in MODES or name not in analyses.names():
                    others = [n for n in analyses.names() if n not in MODES]
                    raise ArgumentError(f"sweep key analyses: {name!r} is not an analysis a cell runs once per model, "
                                        f"task and seed; known: {', '.join(others)}")
        if any(isinstance(s, bool) or not isinstance(s, int) for s in self.seeds):
            raise ArgumentError(f"seeds must be integers, got {list(self.seeds)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ArgumentError(f"threshold={self.threshold} must be a fraction in [0, 1]")
        if self.n_prompts < 1 or self.batch_size < 1:
            raise ArgumentError("n_prompts and batch_size must be integers >= 1")
        if len(set(self.models)) != len(self.models) or len(set(self.seeds)) != len(self.seeds):
            raise ArgumentError("models and seeds must not repeat")
        try:
            if self.device_map is not None:
                placement.check_device_map(self.device_map)
            placement.parse_max_memory(self.max_memory)
        except ArgumentError as err:
            raise ArgumentError(f"sweep key {str(err).lstrip('-').replace('-', '_', 1)}") from None
        if self.max_memory is not None and self.device_map is None:
            raise ArgumentError("sweep key max_memory needs device_map (auto, balanced or sequential)")
        try:
            FitSpec(self.fit_size, self.fit_min_count, self.fit_seed, self.fit_population).validate()
        except ArgumentError as err:
            raise ArgumentError(f"sweep key {err}".replace("fit ", "fit_", 1)) from None
        self.prompt_spec(self.tasks[0], 0)  # numbers, shots, chat
        from circuits.prompts.spec import check_prompt_count

        for task in self.tasks:  # prompts a task cannot give fail every cell of it after loading the model
            check_prompt_count(task, self.n_prompts, self.source, self.shots, flag="sweep key n_prompts")
        return self

    def model_spec(self, name: str) -> ModelSpec:
        """The :class:`~circuits.models.spec.ModelSpec` of model ``name`` with the sweep's backend and placement."""
        from circuits.models.spec import ModelSpec

        return ModelSpec(name, backend=self.backend, dtype=self.dtype, device=self.device,
                         device_map=self.device_map, max_memory=self.max_memory, remote=self.remote)

    def extra_analyses(self) -> tuple[str, ...]:
        """The analyses run once per model, task and seed besides the ablations (``necessity``, ``lens`` and
        ``analyses``), in that order."""
        flags = tuple(name for name, on in (("necessity", self.necessity), ("lens", self.lens)) if on)
        return tuple(dict.fromkeys(flags + tuple(self.analyses)))

    def settings(self, cell: Cell) -> JsonDict:
        """What the sweep sets of a cell's config (:meth:`circuits.analyses.Analysis.config_for`): its seed, the
        batch size, the threshold and grid of a search, the configuration of a fixed cell and the ablation of
        an ablation cell."""
        out = {"seed": cell.seed, "batch_size": self.batch_size, "threshold": self.threshold, "grid": self.grid,
               "wait": self.wait, "transfer": self.transfer}
        if cell.ablation != cell.analysis:
            out["ablation"] = cell.ablation
        return {k: v for k, v in out.items() if v is not None}

    def prompt_spec(self, task: str, seed: int) -> PromptSpec:
        """The :class:`~circuits.prompts.spec.PromptSpec` of the cells of ``task`` and ``seed``."""
        from circuits.prompts.spec import PromptSpec
        from circuits.tasks.formats import PromptFormat

        fit = FitSpec(size=self.fit_size, min_count=self.fit_min_count, seed=self.fit_seed,
                      population=self.fit_population)
        try:
            return PromptSpec(task=task, n_prompts=self.n_prompts, seed=seed, source=self.source, fit=fit,
                              numbers=self.numbers, format=PromptFormat(shots=self.shots, chat=self.chat)).validate()
        except ArgumentError as err:
            raise ArgumentError(f"sweep key {err}") from None

    def cells(self) -> Iterator[Cell]:
        """Every cell, model by model (so that each model is loaded once)."""
        for model in self.models:
            for task in self.tasks:
                for seed in self.seeds:
                    for ablation in self.ablations:
                        yield Cell(model, task, ablation, seed, self.mode)
                    for name in self.extra_analyses():
                        yield Cell(model, task, name, seed, name)

    def identity(self) -> JsonDict:
        """What determines the sweep's cells (everything but the device, the device map, the batch size and the
        threshold: the threshold only selects among a cell's stored results, so another one into a finished
        sweep reselects every cell and evaluates nothing with the full grid)."""
        d = dataclasses.asdict(self)
        for key in ("extra", "device", "batch_size", "device_map", "max_memory", "threshold"):
            d.pop(key)
        if not d["analyses"]:  # the sweeps of earlier releases had none: their identities stay the same
            d.pop("analyses")
        return d
