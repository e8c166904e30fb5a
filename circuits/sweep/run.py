"""Running a sweep: every cell an ordinary run directory, each model loaded once, prompts, fit set and means
once per (model, task, seed), a failing cell recorded and the others run on."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from circuits import files
from circuits.sweep.config import Cell, SweepConfig

CELLS_DIR = "cells"
SWEEP_RESULTS = "cells.jsonl"


@dataclass
class CellResult:
    """One row of the sweep's table.

    ``status``: ``"ok"`` or ``"error"`` (then ``error`` says why). ``faithfulness``/``ci_low``/``ci_high``:
    of the selected configuration (search; ``selected`` is ``False`` when none reaches the threshold and
    the row shows the most faithful one), of the fixed configuration (fixed), the smallest per-block
    faithfulness (necessity, ``wait`` = that block) or the final answer probability (lens); ``faith_by_wait``: per wait, the best faithfulness evaluated (search);
    ``path``: the cell's run directory relative to the sweep's ``--out``.
    """

    model: str
    task: str
    ablation: str
    seed: int
    status: str = "ok"
    error: str | None = None
    base_accuracy: float | None = None
    n_prompts: int | None = None
    wait: int | None = None
    transfer: int | None = None
    faithfulness: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    faith_by_wait: dict[str, float] = field(default_factory=dict)
    path: str = ""
    selected: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    def load(cls, out: str | Path) -> "SweepResult":
        """The sweep of ``out`` (its ``summary.json``; ``FileNotFoundError`` while it has not finished)."""
        import dataclasses

        from circuits.runs import read_json_object

        path = Path(out)
        if not (path / files.SUMMARY).is_file():
            raise FileNotFoundError(f"{path} holds no {files.SUMMARY}: not a finished sweep")
        summary = read_json_object(path / files.SUMMARY)
        names = {f.name for f in dataclasses.fields(SweepConfig)} - {"extra"}
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in summary["config"].items() if k in names}
        config = SweepConfig(**raw)
        known = {f.name for f in dataclasses.fields(CellResult)}
        cells = [CellResult(**{k: v for k, v in c.items() if k in known}) for c in summary.get("cells", [])]
        return cls(config=config, cells=cells, seconds=float(summary.get("seconds", 0.0)), out_dir=path)

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``: one row per cell (the columns of ``table.csv``)."""
        from circuits.frames import dataframe
        from circuits.sweep.table import COLUMNS, prompt_format

        shown = prompt_format(self.config)
        return dataframe([{**c.to_dict(), "prompt_format": shown} for c in self.cells], COLUMNS)

    def plot(self, model: str | None = None, ablation: str | None = None) -> Any:
        """The report's heatmap of ``model`` (default: the first) and ``ablation`` (default: the first)."""
        from circuits.sweep.table import heatmap

        model = model if model is not None else self.config.models[0]
        if model not in self.config.models:
            raise ValueError(f"model {model!r} is not in this sweep: {', '.join(self.config.models)}")
        if ablation is None and self.config.mode != "fixed":
            ablation = self.config.ablations[0]
        return heatmap(self.config, model, self.cells, ablation)

    def figures(self) -> list[Any]:
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
            raise ValueError(f"cell {model}/{task}/{ablation}/seed {seed} failed: {row.error}")
        return load(Path(self.out_dir or ".") / row.path)


def run_sweep(config: SweepConfig, out: str | Path, *, progress: bool = True,
              command: list[str] | None = None) -> list[CellResult]:
    """Run every cell of ``config`` under ``out/cells/`` and return the table rows (also written as
    ``table.csv``, ``table.md`` and ``report.html`` in ``out``). Re-running resumes cell by cell and,
    inside a cell, configuration by configuration."""
    from circuits.runner import Run
    from circuits.runs import RunDir
    from circuits.sweep.table import write_outputs

    out = Path(out)
    t0 = time.perf_counter()
    cells = list(config.cells())
    folders = {cell: cell_folder(out, cell) for cell in cells}  # names from data checked before anything is written
    with Run(out, "sweep"):
        RunDir(out, {"analysis": "sweep", **config.identity()}, results_name=files.NO_RESULTS).open()
        from circuits import report

        if report.plotlyjs_mode() == "directory":
            report.ensure_plotlyjs(out)  # one plotly.js for the sweep's report and every cell's
        rows = []
        bar = tqdm(cells, desc="sweep", unit="cell", disable=not progress)
        state = _State(config, command or ["af1", "sweep"])
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
    from circuits.atomic import inside, safe_name

    from circuits.sweep.config import slug

    parts = (safe_name(slug(cell.model), "model"), safe_name(cell.task, "task"),
             safe_name(f"{cell.ablation}-seed{cell.seed}", "ablation"))
    return inside(out / CELLS_DIR, Path(*parts), "cell folder")


class _State:
    """The model, prompts and means of the current (model, task, seed), reused across its cells."""

    def __init__(self, config: SweepConfig, command: list[str]):
        self.config = config
        self.command = command
        self.model_name: str | None = None
        self.model: Any = None
        self.model_error: str | None = None
        self.key: tuple | None = None
        self.prompts: Any = None
        self.means: Any = None
        self.prompt_error: str | None = None
        self.progress = True

    def load(self, cell: Cell) -> None:
        from circuits.specs import ModelSpec

        cfg = self.config
        prompt_spec = cfg.prompt_spec(cell.task, cell.seed)
        if cell.model != self.model_name:
            self.model_name, self.model, self.model_error, self.key = cell.model, None, None, None
            spec = ModelSpec(cell.model, backend=cfg.backend, dtype=cfg.dtype, device=cfg.device,
                             device_map=cfg.device_map, max_memory=cfg.max_memory, remote=cfg.remote)
            try:
                self.model = spec.load(estimate=prompt_spec, batch_size=cfg.batch_size)
            except Exception as err:  # noqa: BLE001 - a failing cell is recorded, the others run on
                self.model_error = message(err)
        key = (cell.model, cell.task, cell.seed)
        if self.model is not None and key != self.key:
            self.key, self.prompts, self.means, self.prompt_error = key, None, None, None
            # One prompt set per (model, task, seed) for every ablation: drawn as CAMA needs it when any cell
            # needs means, so the cells of one row score the same prompts.
            means = "cama" if any(a in ("cama", "mean") for a in cfg.ablations) else None
            try:
                self.prompts = prompt_spec.prepare(self.model, means=means, progress=self.progress,
                                                   batch_size=cfg.batch_size)
            except Exception as err:  # noqa: BLE001
                self.prompt_error = message(err)

    def cache(self) -> Any:
        """``MeanCache.fit`` on the current fit set (once per (model, task, seed))."""
        import interventions as iv

        if self.means is None:
            self.means = iv.MeanCache.fit(self.model, self.prompts.fit.tokens, batch_size=self.config.batch_size,
                                          progress=self.progress)
        return self.means

    def run(self, cell: Cell, folder: Path, progress: bool) -> CellResult:
        row = CellResult(cell.model, cell.task, cell.ablation, cell.seed, path=str(Path(CELLS_DIR) / cell.folder()))
        self.progress = progress
        self.load(cell)
        error = self.model_error or self.prompt_error
        if error is not None:
            row.status, row.error = "error", error
            return row
        try:
            fill(row, self.run_cell(cell, folder, progress), self.prompts)
        except Exception as err:  # noqa: BLE001
            row.status, row.error = "error", message(err)
        return row

    def run_cell(self, cell: Cell, folder: Path, progress: bool) -> Any:
        from circuits.runner import execute

        cfg, p = self.config, self.prompts
        meta = {"model": cell.model, **cfg.prompt_spec(cell.task, cell.seed).meta(), "base_accuracy": p.base_accuracy,
                "n_checked": p.n_checked, "command": self.command}
        common = dict(out_dir=folder, meta=meta, progress=progress)
        if cell.kind == "necessity":
            from circuits.necessity import NECESSITY, NecessityConfig

            return execute(NECESSITY, self.model, p.tokens, p.answers,
                           NecessityConfig(seed=cell.seed, batch_size=cfg.batch_size), **common)
        if cell.kind == "lens":
            from circuits.lens.analysis import LENS, LensConfig

            records = [{"prompt": s, "answer": int(v)} for s, v in zip(p.prompts, p.answer_values)]
            meta = {**meta, "seed": cell.seed, "n_requested": cfg.n_prompts, "t0": time.time()}
            result, _ = execute(LENS, self.model, p.tokens, p.answers, LensConfig(seed=cell.seed), out_dir=folder,
                                meta=meta, prompts=records, progress=False)
            return result
        needs = cell.ablation in ("cama", "mean")
        means = dict(cache=self.cache(), fit=p.fit) if needs else {}
        if cfg.mode == "fixed":
            from circuits.search.fixed import FIXED, FixedConfig

            config = FixedConfig(cfg.wait, cfg.transfer, cell.ablation, cell.seed, cfg.batch_size)
            return execute(FIXED, self.model, p.tokens, p.answers, config, prompts=p.records(), **means, **common)
        from circuits.search import SEARCH, SearchConfig

        config = SearchConfig(threshold=cfg.threshold, grid=cfg.grid, ablation=cell.ablation, seed=cell.seed,
                              batch_size=cfg.batch_size)
        return execute(SEARCH, self.model, p.tokens, p.answers, config, prompts=p.records(), **means, **common)


def fill(row: CellResult, result: Any, prompts: Any) -> None:
    """Copy what the table shows from a cell's result into ``row``."""
    row.base_accuracy, row.n_prompts = float(prompts.base_accuracy), int(len(prompts))
    if hasattr(result, "selected"):  # a search
        best: dict[str, float] = {}
        for r in result.results:
            best[str(r.wait)] = max(best.get(str(r.wait), 0.0), r.faithfulness)
        row.faith_by_wait = dict(sorted(best.items(), key=lambda kv: -int(kv[0])))
        row.selected = result.selected is not None
        pick = result.selected or max(result.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer))
    elif hasattr(result, "blocks"):  # necessity: the most necessary block
        pick = min(result.blocks, key=lambda b: b.faithfulness)
        row.wait = pick.layer
        row.faithfulness, row.ci_low, row.ci_high = pick.faithfulness, pick.ci_low, pick.ci_high
        return
    elif hasattr(result, "rows"):  # lens: the final answer probability
        final = result.rows(n_boot=200)[-1]
        row.faithfulness = float(final["answer_prob"])
        return
    else:
        pick = result
    if pick is not None:
        row.wait, row.transfer = pick.wait, pick.transfer
        row.faithfulness, row.ci_low, row.ci_high = pick.faithfulness, pick.ci_low, pick.ci_high


def message(err: BaseException) -> str:
    """The one-line message the command line would print for ``err``."""
    from circuits.cli import describe, one_line

    known = describe(err)
    return known[0] if known is not None else f"{type(err).__name__}: {one_line(err)}"
