"""Several runs' results side by side (``af1 compare``, :func:`circuits.results.compare`): one table and one figure,
whichever command wrote each run.

Each run becomes rows of one measure (:data:`METRICS`): ``af1``, the faithfulness of an AF1 configuration (an
``af1 search`` run: its selected configuration, or the most faithful one when none reaches the threshold; a fixed
configuration; every search or fixed cell of an ``af1 sweep``), or ``necessity``, the faithfulness with the last
token's attention to earlier tokens cut in one block (``af1 necessity``: one row per block). Runs compare when they
measure the same thing on the same prompts' task: one measure and the same task(s); any other set is refused in one
line saying which two runs differ and how (:class:`~circuits.errors.ArgumentError`).

Pure: the runs' contents come in (:class:`RunRows`, built from a reopened result by :func:`rows_of`), a
:class:`Comparison` goes out; reading run directories is :func:`circuits.results.compare`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError

if TYPE_CHECKING:
    from interventions.types import DataFrame, Figure, JsonDict, JsonMapping

__all__ = ["COLUMNS", "METRICS", "Comparison", "RunRows", "compare_runs", "rows_of"]

METRICS = {
    "af1": "faithfulness of the AF1 configuration (search: the selected one, else the most faithful; fixed: the "
           "configuration given)",
    "necessity": "faithfulness with the last token's attention to earlier tokens cut in one block",
}
"""What a run's rows measure: runs of one measure compare."""
KINDS = {"search": "af1", "fixed": "af1", "sweep": "af1", "necessity": "necessity"}
"""The measure of each kind of run ``af1 compare`` reads."""
AF1_ABLATIONS = ("cama", "mean", "zero")
"""A sweep cell of these ablations holds an AF1 configuration (its necessity and lens cells are left out)."""
COLUMNS = ("run", "command", "cell", "model", "task", "ablation", "seed", "n_prompts", "base_accuracy", "metric",
           "item", "wait", "transfer", "block", "selected", "faithfulness", "ci_low", "ci_high")
"""The columns of :attr:`Comparison.table`: one row per run and item (an AF1 configuration or a block).
``cell``: a sweep's ``model/task/ablation/seed S`` (``""`` for a run of one cell); ``selected``: whether the
configuration reaches the run's threshold (a search), ``None`` where no threshold applies."""


@dataclass(frozen=True)
class RunRows:
    """One run as :func:`compare_runs` reads it: its ``label`` (the directory as given), the ``command`` that wrote
    it, its ``tasks``, the ``metric`` of :data:`METRICS` its ``rows`` (dicts of :data:`COLUMNS`) measure."""

    label: str
    command: str
    tasks: tuple[str, ...]
    metric: str
    rows: tuple[JsonMapping, ...]


def rows_of(label: str, command: str, identity: JsonMapping, result: Any) -> RunRows:
    """The :class:`RunRows` of a reopened run: ``command`` as :func:`circuits.results.kind_of` names it (``fixed``
    runs open as searches), ``identity`` its ``run.json``, ``result`` what :func:`circuits.results.load` returned.
    :class:`~circuits.errors.ArgumentError` for a kind of run that holds none of :data:`METRICS`."""
    kind = str(identity.get("analysis", command)) if command == "search" else command
    if kind not in KINDS:
        raise ArgumentError(f"{label} is an af1 {command} run: af1 compare reads search, fixed, sweep and necessity "
                            f"runs ({command} runs have no faithfulness of a configuration or a block to compare)")
    common = {"run": label, "command": kind, "cell": "", "model": identity.get("model"), "seed": identity.get("seed"),
              "task": identity.get("task"), "metric": KINDS[kind]}
    if kind == "necessity":
        rows = [{**common, "ablation": "necessity", "n_prompts": b.n, "base_accuracy": None,
                 "item": f"block {b.layer}", "block": b.layer, "faithfulness": b.faithfulness, "ci_low": b.ci_low,
                 "ci_high": b.ci_high} for b in result.blocks]
        return RunRows(label, kind, (str(identity.get("task")),), "necessity", tuple(rows))
    if kind == "sweep":
        cells = [c for c in result.cells if c.status == "ok" and c.ablation in AF1_ABLATIONS]
        rows = [{**common, "cell": f"{c.model}/{c.task}/{c.ablation}/seed {c.seed}", "model": c.model, "task": c.task,
                 "ablation": c.ablation, "seed": c.seed, "n_prompts": c.n_prompts, "base_accuracy": c.base_accuracy,
                 "item": config_item(c.wait, c.transfer), "wait": c.wait, "transfer": c.transfer,
                 "selected": c.selected if result.config.mode == "search" else None, "faithfulness": c.faithfulness,
                 "ci_low": c.ci_low, "ci_high": c.ci_high} for c in cells]
        if not rows:
            raise ArgumentError(f"{label}: the sweep has no finished search or fixed cell to compare")
        return RunRows(label, kind, tuple(dict.fromkeys(str(c.task) for c in cells)), "af1", tuple(rows))
    chosen = result.selected
    if chosen is None and result.results:
        chosen = max(result.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer))
    if chosen is None:
        raise ArgumentError(f"{label}: the {kind} run has no evaluated configuration yet; finish it first")
    row = {**common, "ablation": result.ablation, "n_prompts": result.n_prompts, "base_accuracy":
           result.base_accuracy, "item": config_item(chosen.wait, chosen.transfer), "wait": chosen.wait,
           "transfer": chosen.transfer, "selected": (result.selected is not None) if kind == "search" else None,
           "faithfulness": chosen.faithfulness, "ci_low": chosen.ci_low, "ci_high": chosen.ci_high}
    return RunRows(label, kind, (str(identity.get("task")),), "af1", (row,))


def config_item(wait: int | None, transfer: int | None) -> str:
    """How a table row names an AF1 configuration: ``"wait=3, transfer=1"``."""
    return f"wait={wait}, transfer={transfer}"


def check_comparable(runs: Sequence[RunRows]) -> None:
    """:class:`~circuits.errors.ArgumentError` in one line unless the runs measure the same thing on the same tasks:
    fewer than two runs, a run given twice, two measures, or two sets of tasks (naming the first pair that differs)."""
    if len(runs) < 2:
        raise ArgumentError(f"af1 compare needs at least two runs, got {len(runs)}: give two or more run directories")
    labels = [r.label for r in runs]
    twice = next((x for x in labels if labels.count(x) > 1), None)
    if twice is not None:
        raise ArgumentError(f"{twice} is given twice: give each run once")
    first = runs[0]
    for other in runs[1:]:
        if other.metric != first.metric:
            raise ArgumentError(
                f"cannot compare {first.label} ({first.command}: {first.metric} faithfulness) with {other.label} "
                f"({other.command}: {other.metric} faithfulness): different measures; compare search, fixed and "
                f"sweep runs together, necessity runs together")
        if set(other.tasks) != set(first.tasks):
            raise ArgumentError(
                f"cannot compare {first.label} (task {', '.join(first.tasks)}) with {other.label} (task "
                f"{', '.join(other.tasks)}): different tasks; compare runs on the same task(s)")


@dataclass
class Comparison:
    """Runs side by side: ``runs`` (their labels, in the order given), the ``metric`` they share (:data:`METRICS`)
    and ``rows`` (dicts of :data:`COLUMNS`). :meth:`to_pandas` is the table, :meth:`plot` the figure,
    :meth:`text` the table as the command line prints it."""

    runs: list[str]
    metric: str
    rows: list[JsonDict] = field(default_factory=list)

    def to_pandas(self) -> DataFrame:
        """A ``pandas.DataFrame`` of :data:`COLUMNS`: one row per run and item (configuration or block)."""
        from circuits.store.frames import dataframe

        return dataframe(self.rows, COLUMNS)

    @property
    def table(self) -> DataFrame:
        """The same as :meth:`to_pandas`."""
        return self.to_pandas()

    def side_by_side(self) -> DataFrame:
        """Necessity runs: a ``pandas.DataFrame`` of faithfulness with a row per block and a column per run; AF1
        runs: :meth:`to_pandas` (a row per run or sweep cell already)."""
        frame = self.to_pandas()
        if self.metric != "necessity":
            return frame
        return frame.pivot(index="block", columns="run", values="faithfulness")[self.runs]

    def plot(self) -> Figure:
        """The figure (plotly): AF1 runs, each run's (or sweep cell's) faithfulness with its 95% interval, coloured
        by ablation; necessity runs, faithfulness per block with its 95% interval, a line per run."""
        import plotly.graph_objects as go

        fig = go.Figure()
        if self.metric == "necessity":
            for run in self.runs:
                mine = [r for r in self.rows if r["run"] == run]
                fig.add_trace(go.Scatter(x=[r["block"] for r in mine], y=[r["faithfulness"] for r in mine],
                                         mode="lines+markers", name=f"{run} ({mine[0]['model']})",
                                         error_y=interval(mine)))
            fig.update_layout(xaxis_title="block whose attention to earlier tokens is cut", xaxis=dict(dtick=1))
        else:
            for ablation in dict.fromkeys(r["ablation"] for r in self.rows):
                mine = [r for r in self.rows if r["ablation"] == ablation]
                fig.add_trace(go.Scatter(x=[row_label(r) for r in mine], y=[r["faithfulness"] for r in mine],
                                         mode="markers", name=f"{ablation} ablation", error_y=interval(mine),
                                         text=[r["item"] for r in mine],
                                         hovertemplate="%{x}<br>%{text}<br>faithfulness %{y:.3f}"))
            fig.update_layout(xaxis_title="run (and sweep cell): the configuration in the hover",
                              xaxis=dict(type="category"))
        fig.update_layout(title=f"{METRICS[self.metric]}; bars: 95% interval", yaxis_title="faithfulness",
                          yaxis=dict(range=[-0.02, 1.02]), height=480)
        return fig

    def figures(self) -> list[Figure]:
        """Every figure of ``af1 compare``'s report."""
        return [self.plot()]

    def text(self) -> str:
        """The table as ``af1 compare`` prints it, faithfulness with its 95% interval in aligned columns: AF1 runs a
        line per run (or sweep cell); necessity runs a line per block and a column per run (its model above)."""
        faith = lambda r: f"{r['faithfulness']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"  # noqa: E731
        if self.metric == "af1":
            lines = [["run", "model", "task", "ablation", "seed", "configuration", "faithfulness [95% CI]",
                      "selected"]]
            for r in self.rows:
                sel = "-" if r["selected"] is None else "yes" if r["selected"] else "no"
                lines.append([row_label(r), str(r["model"]), str(r["task"]), str(r["ablation"]), str(r["seed"]),
                              str(r["item"]), faith(r), sel])
        else:
            first = {run: next(r for r in self.rows if r["run"] == run) for run in self.runs}
            lines = [["block", *self.runs], ["", *(str(first[run]["model"]) for run in self.runs)]]
            cells = {(r["block"], r["run"]): faith(r) for r in self.rows}
            for block in sorted({r["block"] for r in self.rows}):
                lines.append([str(block), *(cells.get((block, run), "-") for run in self.runs)])
        widths = [max(len(x[i]) for x in lines) for i in range(len(lines[0]))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip() for x in lines)


def row_label(row: JsonMapping) -> str:
    """A row's run, with its sweep cell when it has one (``runs/s: arith-gpt2/add/cama/seed 0``)."""
    return f"{row['run']}: {row['cell']}" if row["cell"] else str(row["run"])


def interval(rows: Sequence[JsonMapping]) -> JsonDict:
    """Plotly ``error_y`` of the rows' 95% intervals (asymmetric, around their faithfulness)."""
    return {"type": "data", "symmetric": False, "array": [r["ci_high"] - r["faithfulness"] for r in rows],
            "arrayminus": [r["faithfulness"] - r["ci_low"] for r in rows]}


def compare_runs(runs: Sequence[RunRows]) -> Comparison:
    """The :class:`Comparison` of ``runs`` (checked: :func:`check_comparable`), rows in the order the runs are given."""
    check_comparable(runs)
    return Comparison(runs=[r.label for r in runs], metric=runs[0].metric,
                      rows=[{k: row.get(k) for k in COLUMNS} for r in runs for row in r.rows])
