"""Running a sweep: every cell an ordinary run directory, each model loaded once, prompts, fit set and means
once per (model, task, seed), a failing cell recorded and the others run on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from circuits import timing
from circuits.errors import ArgumentError
from circuits.logs import get_logger
from circuits.store import files
from circuits.sweep.config import Cell, SweepConfig
from circuits.sweep.rows import CellResult
from interventions.types import DataFrame, Figure, JsonDict, Model

if TYPE_CHECKING:
    from circuits.analyses import AnalysisConfig
    from circuits.prompts.sampling import Prompts
    from circuits.prompts.spec import PromptSpec
    from interventions.cache import MeanCache


@dataclass
class SweepResult:
    """A finished sweep reopened from its ``--out`` directory (:meth:`load`): the ``config``, one
    :class:`CellResult` per cell (``cells``, the rows of ``table.csv``), the wall time and the directory.
    :meth:`cell` reopens one cell's own result; :meth:`to_pandas` and :meth:`plot` give the table and the
    report's heatmaps."""

    config: SweepConfig
    cells: list[CellResult]
    seconds: float
    out_dir: Path | None = None

    @classmethod
    def load(cls, out: str | Path) -> SweepResult:
        """The sweep of ``out`` (its ``summary.json``; ``FileNotFoundError`` while it has not finished)."""
        import dataclasses

        from circuits.store.runs import read_json_object

        path = Path(out)
        if not (path / files.SUMMARY).is_file():
            raise FileNotFoundError(f"{path} holds no {files.SUMMARY}: not a finished sweep")
        from circuits.store import fields as jf

        sp = path / files.SUMMARY
        summary = read_json_object(sp)
        names = {f.name for f in dataclasses.fields(SweepConfig)} - {"extra"}
        raw: JsonDict = {k: tuple(v) if isinstance(v, list) else v
                               for k, v in jf.mapping(summary, "config", sp).items() if k in names}
        known = {f.name for f in dataclasses.fields(CellResult)}
        rows = summary.get("cells", [])
        if not isinstance(rows, list) or not all(isinstance(c, dict) for c in rows):
            raise jf.corrupt(sp, "cells", "is not a list of objects")
        try:
            config = SweepConfig(**raw)
            cells = [CellResult(**{k: v for k, v in c.items() if k in known}) for c in rows]
        except TypeError as err:  # a required field missing
            raise jf.corrupt(sp, "config" if "SweepConfig" in str(err) else "cells", f"is incomplete ({err})") from None
        return cls(config=config, cells=cells, seconds=jf.number(summary, "seconds", sp, 0.0), out_dir=path)

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame``: one row per cell (the columns of ``table.csv``)."""
        from circuits.store.frames import dataframe
        from circuits.sweep.table import COLUMNS, prompt_format

        return dataframe([{**c.to_dict(), "prompt_format": prompt_format(self.config, c.task)} for c in self.cells],
                         COLUMNS)

    def plot(self, model: str | None = None, ablation: str | None = None) -> Figure:
        """The report's heatmap of ``model`` (default: the first) and ``ablation`` (default: the first)."""
        from circuits.sweep.table import heatmap

        model = model if model is not None else self.config.models[0]
        if model not in self.config.models:
            raise ArgumentError(f"model {model!r} is not in this sweep: {', '.join(self.config.models)}")
        if ablation is None and self.config.mode != "fixed":
            ablation = self.config.ablations[0]
        return heatmap(self.config, model, self.cells, ablation)

    def figures(self) -> list[Figure]:
        """Every heatmap of the report."""
        from circuits.sweep.table import figures

        return figures(self.config, self.cells)

    def cell(self, model: str, task: str, ablation: str = "cama", seed: int = 0) -> Any:
        """The result of one cell, reopened from its run directory (:func:`circuits.results.load`)."""
        from circuits.results import load

        row = next((c for c in self.cells if (c.model, c.task, c.ablation, c.seed) == (model, task, ablation, seed)),
                   None)
        if row is None:
            raise KeyError(f"no cell model={model!r}, task={task!r}, ablation={ablation!r}, seed={seed} in this sweep")
        if row.status != "ok":
            raise ArgumentError(f"cell {model}/{task}/{ablation}/seed {seed} failed: {row.error}")
        return load(Path(self.out_dir or ".") / row.path)


def run_sweep(config: SweepConfig, out: str | Path, *, progress: bool = True,
              command: list[str] | None = None) -> list[CellResult]:
    """Run every cell of ``config`` under ``out/cells/`` and return the table rows (also written as
    ``table.csv``, ``table.md`` and ``report.html`` in ``out``). Re-running resumes cell by cell and,
    inside a cell, configuration by configuration."""
    from circuits.runner import Run
    from circuits.store.runs import RunDir
    from circuits.sweep.table import write_outputs

    out = Path(out)
    t0 = time.perf_counter()
    cells = list(config.cells())
    folders = {cell: cell_folder(out, cell) for cell in cells}  # names from data checked before anything is written
    with Run(out, "sweep"):
        # Earlier releases recorded the threshold: their directories resume with any.
        RunDir(out, {"analysis": "sweep", **config.identity()}, results_name=files.NO_RESULTS,
               optional=("threshold",)).open()
        from circuits import report

        if report.plotlyjs_mode() == "directory":
            report.ensure_plotlyjs(out)  # one plotly.js for the sweep's report and every cell's
        rows = []
        bar = tqdm(cells, desc="sweep", unit="cell", disable=not progress)
        state = _State(config, command or ["af1", "sweep"], folders)
        try:
            for cell in bar:
                bar.set_postfix(model=cell.model, task=cell.task, ablation=cell.ablation, seed=cell.seed)
                rows.append(state.run(cell, folders[cell], progress))
        finally:
            bar.close()
        write_outputs(config, rows, out, seconds=time.perf_counter() - t0)
    return rows


def cell_folder(out: Path, cell: Cell) -> Path:
    """The run directory of ``cell``: ``<out>/cells/<model>/<task>/<ablation>-seed<seed>``, each part one plain
    folder name (a task or model name holding ``/`` or ``..`` is refused, so no cell lies outside ``out``)."""
    from circuits.store.atomic import inside, safe_name
    from circuits.sweep.config import slug, task_slug

    parts = (safe_name(slug(cell.model), "model"), safe_name(task_slug(cell.task), "task"),
             safe_name(f"{cell.ablation}-seed{cell.seed}", "ablation"))
    return inside(out / files.CELLS_DIR, Path(*parts), "cell folder")


class _State:
    """The model, prompts and means of the current (model, task, seed), reused across its cells."""

    def __init__(self, config: SweepConfig, command: list[str], folders: dict[Cell, Path] | None = None):
        self.config = config
        self.command = command
        self.folders = folders or {}
        self.model_name: str | None = None
        self.model: Model | None = None
        self.model_error: str | None = None
        self.key: tuple | None = None
        self.prompts: Prompts | None = None
        self.means: MeanCache | None = None
        self.prompt_error: str | None = None
        self.progress = True

    def load(self, cell: Cell) -> None:
        cfg = self.config
        prompt_spec = cfg.prompt_spec(cell.task, cell.seed)
        if cell.model != self.model_name:
            self.model_name, self.model, self.model_error, self.key = cell.model, None, None, None
            try:
                with timing.phase("load"):
                    self.model = cfg.model_spec(cell.model).load(estimate=prompt_spec, batch_size=cfg.batch_size)
            except Exception as err:  # noqa: BLE001 - see message(): a failing cell is recorded, the others run
                self.model_error = message(err)
        key = (cell.model, cell.task, cell.seed)
        if self.model is not None and key != self.key:
            self.key, self.prompts, self.means, self.prompt_error = key, None, None, None
            try:
                with timing.phase("prompts"):
                    self.prompts = self.prepare(prompt_spec, key)
            except Exception as err:  # noqa: BLE001 - see message()
                self.prompt_error = message(err)

    def prepare(self, spec: PromptSpec, key: tuple) -> Prompts:
        """The prompts of ``spec``: reloaded from a cell of the same (model, task, seed) that prepared them
        under the same key (:mod:`circuits.prompts.prepared`), else prepared. One prompt set serves every cell of the
        (model, task, seed), so the cells of a row score the same prompts: drawn as CAMA needs them (its fit
        set backing every entry they read) when any of those cells needs means."""
        from circuits import analyses
        from circuits.prompts import prepared

        assert self.model is not None, "prepare() follows a successful load()"
        group = [c for c in self.folders if (c.model, c.task, c.seed) == key]
        needs = any(analyses.get(c.analysis).needs_means(self.cell_config(c)) for c in group)
        return prepared.prepare(spec, self.model, means="cama" if needs else None, out=[self.folders[c] for c in group],
                                progress=self.progress, batch_size=self.config.batch_size)

    def cell_config(self, cell: Cell) -> AnalysisConfig:
        """The config of ``cell``'s analysis (:meth:`circuits.analyses.Analysis.config_for`)."""
        from circuits import analyses

        return analyses.get(cell.analysis).config_for(self.config.settings(cell))

    def keep_means(self, cache: MeanCache) -> None:
        """Keep the means cache a cell used (fitted, or reloaded from its run directory) for the other cells of
        the current (model, task, seed)."""
        self.means = cache

    def run(self, cell: Cell, folder: Path, progress: bool) -> CellResult:
        row = CellResult(cell.model, cell.task, cell.ablation, cell.seed,
                         path=str(Path(files.CELLS_DIR) / cell.folder()))
        self.progress = progress
        self.load(cell)
        error = self.model_error or self.prompt_error
        if error is not None:
            row.status, row.error = "error", error
            return row
        try:
            self.run_cell(cell, folder, progress, row)
        except Exception as err:  # noqa: BLE001 - see message()
            row.status, row.error = "error", message(err)
        return row

    def run_cell(self, cell: Cell, folder: Path, progress: bool, row: CellResult) -> None:
        """Run ``cell``'s analysis in ``folder`` on the current model and prompts (the first cell of a (model,
        task, seed) that needs means fits them, or reloads the cache its run directory holds; the others reuse
        it) and fill ``row`` from its result (:attr:`circuits.analyses.Analysis.summary_row`)."""
        from circuits import analyses
        from circuits.models.spec import LoadedModel
        from circuits.prompts.ready import ReadyPrompts
        from circuits.runner import RunOptions, run

        assert self.model is not None and self.prompts is not None, "a cell runs after a successful load()"
        analysis = analyses.get(cell.analysis)
        ready = ReadyPrompts.of(self.prompts, self.config.prompt_spec(cell.task, cell.seed))
        result = run(analysis, self.cell_config(cell), LoadedModel(self.model, name=cell.model), ready,
                     RunOptions(out=folder, progress=progress, command=self.command, cache=self.means,
                                on_means=self.keep_means))
        fill(row, analysis.summary_row(result), self.prompts, cell.analysis)


ROW_FIELDS = ("wait", "transfer", "faithfulness", "ci_low", "ci_high", "selected", "faith_by_wait")
"""The :class:`CellResult` fields an analysis's ``summary_row`` may set."""


def fill(row: CellResult, values: JsonDict, prompts: Prompts, analysis: str = "") -> None:
    """Copy a cell's ``summary_row`` (``values``) and its prompts' base accuracy and count into ``row``."""
    unknown = sorted(set(values) - set(ROW_FIELDS))
    if unknown:
        raise ValueError(f"the summary row of analysis {analysis!r} has field(s) {', '.join(unknown)} that a sweep "
                         f"row does not: {', '.join(ROW_FIELDS)}")
    row.base_accuracy, row.n_prompts = float(prompts.base_accuracy), int(len(prompts))
    for key, value in values.items():
        setattr(row, key, value)


def message(err: BaseException) -> str:
    """The one-line message the command line would print for ``err`` (:func:`circuits.errors.error_line`).

    The sweep catches every ``Exception`` of a cell (loading its model, preparing its prompts, running it): one
    failing cell must not stop the others, whatever the failure. A bug still reads as one (``internal error:
    Type: ...`` in the cell's row), and its traceback goes to the ``circuits.sweep`` logger at DEBUG (shown by
    ``af1 --debug sweep ...``). Ctrl-C is not an ``Exception``: it stops the sweep."""
    from circuits.errors import describe, error_line

    if describe(err) is None:
        get_logger("sweep").debug("a sweep cell failed", exc_info=err)
    return error_line(err)
