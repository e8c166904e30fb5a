"""Figures that read, checked on the plotly figure objects the reports draw (no browser; the headless-Chromium
check of the rendered pages is benchmarks/report_screenshots.py and tests/benchmarks/test_report_screenshots.py):
the search heatmap outlines its selection without covering the value; an empty smallest-transfer chart says
why; necessity values sit above their intervals; the smallest head set has a legend and labelled cells; the
pruning curve counts whole heads; the attention map grows with its heads; lens axes have readable names, the
rank a log axis and a colour bar in ranks; the sweep draws one heatmap per ablation sized to its tasks; the
reports of one directory share one plotly.js."""

from __future__ import annotations

import re

import numpy as np
import pytest

from circuits import report
from circuits.prune.config import PruneConfig
from circuits.prune.result import CurvePoint, PruneResult
from circuits.search.results import ConfigResult, SearchResult
from circuits.search.rule import select, smallest_transfers


def search_result(faith: dict[tuple[int, int], float], n_layers: int = 3, threshold: float = 0.9,
                  grid: str = "full") -> SearchResult:
    results = [ConfigResult(w, t, f, max(0.0, f - 0.05), min(1.0, f + 0.05), 20, round(20 * f), f, 1.0, "cama")
               for (w, t), f in faith.items()]
    chosen = select(faith, threshold)
    selected = next((r for r in results if (r.wait, r.transfer) == chosen), None)
    return SearchResult(n_layers=n_layers, threshold=threshold, ablation="cama", grid=grid, method="fast",
                        results=results, selected=selected,
                        smallest_transfer=smallest_transfers(faith, n_layers, threshold), n_evaluated=len(results),
                        n_resumed=0, passes=1, seconds=0.1, base_accuracy=1.0, n_prompts=20)


def every_config(n_layers: int) -> list[tuple[int, int]]:
    return [(w, t) for w in range(-1, n_layers) for t in range(0, n_layers - w)]


def test_search_heatmap_outlines_the_selection_and_keeps_its_value_visible():
    faith = {c: (0.95 if c == (1, 1) else 0.2) for c in every_config(3)}
    fig = report.search_heatmap(search_result(faith))
    heat, legend = fig.data
    # The value of the selected cell is written in it (row wait+1, column transfer) ...
    assert heat.text[2][1] == "0.95" and heat.z[2][1] == 0.95
    # ... and nothing is drawn on top of it: the selection is an outline plus a legend entry without a point.
    assert list(legend.x) == [None] and list(legend.y) == [None] and legend.showlegend
    assert legend.name == "selected: wait 1, transfer 1"
    (box,) = fig.layout.shapes
    assert (box.x0, box.x1, box.y0, box.y1) == (0.5, 1.5, 0.5, 1.5) and box.line.dash is None
    # Blank cells are white (not the grey of an empty plot) and the subtitle says what a blank cell is.
    assert fig.layout.plot_bgcolor == "white" and "blank: not a configuration" in fig.layout.title.text
    assert "not evaluated" not in fig.layout.title.text  # the full grid skipped nothing


def test_search_heatmap_without_selection_outlines_the_most_faithful_and_counts_skipped_cells():
    faith = {c: 0.1 for c in every_config(3)}
    faith[(0, 2)] = 0.4
    del faith[(2, 0)], faith[(1, 0)]  # two configurations the grid did not evaluate
    fig = report.search_heatmap(search_result(faith, grid="auto"))
    (box,) = fig.layout.shapes
    assert (box.x0, box.y0) == (1.5, -0.5) and box.line.dash == "dot"
    assert fig.data[1].name == "most faithful (below the threshold): wait 0, transfer 2"
    assert "not evaluated (2, skipped by the auto grid)" in fig.layout.title.text
    assert fig.data[0].z[3][0] is None and fig.data[0].text[3][0] == ""


def test_an_empty_smallest_transfer_chart_says_why():
    faith = {c: 0.3 for c in every_config(3)}
    fig = report.smallest_transfer_figure(search_result(faith, threshold=0.8))
    assert all(y is None for y in fig.data[0].y) and list(fig.data[0].text) == ["none"] * 4
    (note,) = fig.layout.annotations
    assert note.text == "no wait has a sufficient transfer: nothing reaches faithfulness 0.8"
    assert (note.xref, note.yref, note.x, note.y) == ("paper", "paper", 0.5, 0.5)
    assert tuple(fig.layout.yaxis.range) == (0, 3)  # an axis of transfers, not plotly's empty -1..4
    assert "faithfulness >= 0.8" in fig.layout.title.text
    # With a sufficient transfer there is no such note.
    faith[(0, 2)] = 0.9
    full = report.smallest_transfer_figure(search_result(faith, threshold=0.8))
    assert not full.layout.annotations and list(full.data[0].y) == [None, 2, None, None]


def test_necessity_values_sit_above_their_intervals():
    layers, faith = [0, 1, 2], [0.2, 0.5, 0.95]
    ci = [(0.1, 0.35), (0.3, 0.7), (0.9, 1.0)]
    fig = report.necessity_figure(layers, faith, ci)
    bars = fig.data[0]
    assert list(bars.error_y.array) == pytest.approx([0.15, 0.2, 0.05])
    assert list(bars.error_y.arrayminus) == pytest.approx([0.1, 0.2, 0.05])
    assert bars.text is None  # the value is not drawn inside the bar, where the interval's line crosses it
    notes = fig.layout.annotations
    assert [a.text for a in notes] == ["0.20", "0.50", "0.95"] and [a.x for a in notes] == layers
    for a, (_, hi) in zip(notes, ci):
        assert a.y > hi and a.yanchor == "bottom" and not a.showarrow
    assert max(a.y for a in notes) <= fig.layout.yaxis.range[1] - 0.08  # the top label stays inside the axis
    # Without intervals the label sits just above the bar.
    plain = report.necessity_figure(layers, faith)
    assert [a.y for a in plain.layout.annotations] == pytest.approx([f + 0.02 for f in faith])


def prune_result(kept: list[tuple[int, int]] | None, layers: int = 2, heads: int = 4,
                 attention: bool = True) -> PruneResult:
    transfer = [(b, h) for b in range(1, 1 + layers) for h in range(heads)]
    order = [h for h in transfer if h not in (kept or [])] + list(kept or [])
    curve, left = [], list(transfer)
    for step in range(len(transfer) + 1):
        removed = order[step - 1] if step else None
        if removed is not None:
            left.remove(removed)
        f = 1.0 - step / len(transfer)
        curve.append(CurvePoint(step, removed, list(left), len(left), f, f - 0.1, f + 0.05, 20, f, 1.0, 1, 0, 0.1))
    att = {h: [0.5, 0.25, 0.25] for h in (kept or [])} if attention else {}
    return PruneResult(config=PruneConfig(wait=0, transfer=layers), transfer_heads=transfer, curve=curve,
                       smallest_head_set=kept, smallest_step=None, smallest_faithfulness=None, auc=0.5,
                       passes_total=10, attribution_passes_total=0, passes_run=10, seconds=1.0, seconds_run=1.0,
                       n_prompts=20, n_dropped=0, attention=att, key_labels=["<bos>", "pos 1", "="])


def test_smallest_head_set_has_a_legend_and_labelled_cells():
    from circuits.prune.report import kept_heads_figure

    result = prune_result([(1, 2), (2, 0)])
    fig = kept_heads_figure(result)
    heat = fig.data[0]
    assert list(heat.x) == ["H0", "H1", "H2", "H3"] and list(heat.y) == ["L1", "L2"]
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "category"  # ticks are heads, not -0.5..3.5
    assert heat.texttemplate == "%{text}"
    step = {p.removed: p.step for p in result.curve if p.removed}
    for i, b in enumerate((1, 2)):
        for h in range(4):
            kept = (b, h) in result.smallest_head_set
            assert heat.z[i][h] == (1.0 if kept else 0.0)
            assert heat.text[i][h] == ("kept" if kept else f"step {step[(b, h)]}")
    legend = [t for t in fig.data[1:] if t.showlegend]
    assert [t.name for t in legend] == ["kept (in the smallest set)", "removed (at the step shown)"]
    assert [t.marker.color for t in legend] == ["#1f77b4", "#e8e8e8"] == [heat.colorscale[-1][1], heat.colorscale[0][1]]
    assert not heat.showscale
    # The legend stands right of the map (below it, it covered the axis title) and the title wraps.
    assert fig.layout.legend.x > 1 and "<br>" in fig.layout.title.text
    assert fig.layout.height >= 300 and fig.layout.width >= 640


def test_pruning_curve_counts_whole_heads_and_the_attention_map_grows_with_its_heads():
    from circuits.prune.figures import MAX_HEIGHT, attention_figure, curve_figure

    result = prune_result([(1, 0)])
    curve = curve_figure(result)
    assert curve.layout.xaxis.tickformat == "d" and curve.layout.xaxis.dtick == 1
    assert tuple(curve.layout.xaxis.range) == (8.5, -0.5)  # reversed: from all heads down to none
    assert [s.x0 for s in curve.layout.shapes if s.type == "line" and s.x0 == s.x1] == [1]
    small = attention_figure(result)
    big = attention_figure(prune_result([(b, h) for b in range(1, 6) for h in range(4)], layers=5))
    assert small.layout.height < big.layout.height <= MAX_HEIGHT
    assert big.layout.height >= 28 * 20 and big.layout.yaxis.autorange == "reversed"
    assert small.data[0].texttemplate == "%{z:.2f}" and list(small.data[0].y) == ["L1 H0"]


def test_lens_axes_have_readable_names_and_the_rank_a_log_axis():
    from circuits.lens.report import figures, rank_heatmap
    from circuits.lens.result import METRICS
    from tests.circuits.test_lens import small_lens_case

    *_, result = small_lens_case("gpt2")
    figs = figures(result, n_boot=20)
    field = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$")
    for fig in figs:
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            title = axis.title.text or ""
            readable = title and not field.match(title) and not any(m in title for m in METRICS)
            assert readable, (fig.layout.title.text, title)
    by_title = {f.layout.title.text.split(" (")[0]: f for f in figs}
    rank = by_title["Rank of the correct answer + 1"]
    assert rank.layout.yaxis.type == "log" and "1 = top-1" in rank.layout.yaxis.title.text
    shown = [v for t in rank.data for v in t.y if v is not None]
    stored = [r["answer_rank"] for r in result.rows(n_boot=20) if r.get("answer_rank") is not None]
    assert sorted(shown) == pytest.approx(sorted(v + 1 for v in stored))  # plotted as rank + 1: 0 fits a log axis
    for name in ("Probability of the correct answer", "Probability mass on numeric tokens"):
        assert tuple(by_title[name].layout.yaxis.range) == (-0.02, 1.02)
    heat = rank_heatmap(result)
    bar = heat.data[0].colorbar
    assert bar.ticktext[0] == "0 (top-1)" and bar.tickvals[0] == 0.0
    ranks = np.asarray(heat.data[0].customdata, dtype=float)
    assert np.allclose(np.asarray(heat.data[0].z, dtype=float), np.log10(ranks + 1))
    assert [10 ** v - 1 for v in bar.tickvals] == pytest.approx([float(t.split()[0]) for t in bar.ticktext])
    assert "log" in bar.title.text and "rank" in bar.title.text


def test_lens_rank_heatmap_height_is_capped():
    from circuits.lens.figures import HEATMAP_ROW_PX, MAX_LABELLED_ROWS, rank_heatmap

    class Many:
        n_prompts = 500
        prompts = [f"{i}+1=" for i in range(500)]

        def labels(self):
            return ["L0 attn", "L0 mlp"]

        def flat(self, metric):
            return np.arange(1000, dtype=float).reshape(500, 2) % 37

    fig = rank_heatmap(Many())
    assert len(fig.data[0].y) == 200 and fig.layout.height == 180 + HEATMAP_ROW_PX * MAX_LABELLED_ROWS
    assert fig.layout.height < 1400 and not fig.layout.yaxis.showticklabels
    assert fig.data[0].colorbar.ticktext == ("0 (top-1)", "1", "9")  # ranks up to 36


def test_interchange_drops_are_drawn_from_zero():
    from circuits.lens.interchange_check import InterchangeResult
    from circuits.lens.report import interchange_figure

    clean = np.array([0.9, 0.8])
    patched = np.array([[0.7, 0.6], [0.6, 0.5]])  # mean drops 0.2 and 0.3: the axis still shows zero
    ix = InterchangeResult([0, 1], clean, patched, np.array([[True, True], [True, False]]), None, None, "swap")
    fig = interchange_figure([ix])
    assert list(fig.data[0].y) == pytest.approx([0.2, 0.3]) and fig.data[0].name == "swap (n=2)"
    assert fig.layout.yaxis.rangemode == "tozero" and fig.layout.yaxis.zeroline
    assert fig.layout.yaxis.title.text == "clean - patched P(answer)"


def test_sweep_has_one_heatmap_per_ablation_sized_to_its_tasks():
    from circuits.sweep import SweepConfig
    from circuits.sweep.run import CellResult
    from circuits.sweep.table import figures, heatmap_height

    def cells(tasks, ablations):
        return [CellResult("m", t, a, 0, base_accuracy=0.9, n_prompts=20, wait=0, transfer=1,
                           faithfulness=0.1 * i + (0.05 if a == "zero" else 0.0), selected=True,
                           faith_by_wait={"0": 0.1 * i + (0.05 if a == "zero" else 0.0), "-1": 0.0},
                           path=f"cells/{t}-{a}") for i, t in enumerate(tasks) for a in ablations]

    two = SweepConfig(models=("m",), tasks=("add", "sub"), ablations=("cama", "zero", "mean"), seeds=(0,))
    ten_tasks = tuple(f"t{i}" for i in range(10))
    ten = SweepConfig(models=("m",), tasks=ten_tasks, ablations=("cama",), seeds=(0,))
    small = figures(two, cells(("add", "sub"), ("cama", "zero", "mean")))
    (large,) = figures(ten, cells(ten_tasks, ("cama",)))
    assert [f.layout.title.text.split(",")[1].split()[0] for f in small] == ["cama", "zero", "mean"]
    for fig, extra in zip(small, (0.0, 0.05, 0.0)):
        (heat,) = fig.data
        assert list(heat.y) == ["add", "sub"] and list(heat.x) == ["0", "-1"]
        assert heat.z[1][0] == pytest.approx(0.1 + extra)  # this ablation's value, never a mean over ablations
    assert 300 <= small[0].layout.height < large.layout.height <= 1400
    assert small[0].layout.height == 320 and large.layout.height == 200 + 10 * 44  # 44 px per task row
    assert [heatmap_height(n) for n in (20, 30, 40, 50, 100)] == [1080, 1080, 1080, 1300, 1400]  # never 2500 px
    # Each tile shows its value to two decimals (a search sweep's tiles carry no interval).
    assert len(large.data[0].y) == 10 and large.data[0].texttemplate == "%{text}"
    assert [list(row) for row in large.data[0].text] == [[f"{0.1 * i:.2f}", "0.00"] for i in range(10)]


def test_a_fixed_sweep_page_says_its_cells_have_no_report(tmp_path):
    from circuits.sweep import SweepConfig
    from circuits.sweep.run import CellResult
    from circuits.sweep.table import write_outputs

    config = SweepConfig(models=("m",), tasks=("add",), ablations=("cama", "zero"), seeds=(0,), wait=0, transfer=1,
                         mode="fixed")
    rows = [CellResult("m", "add", a, 0, base_accuracy=0.9, n_prompts=20, wait=0, transfer=1, faithfulness=f,
                       selected=False, path=f"cells/m/add/{a}-seed0") for a, f in (("cama", 0.4), ("zero", 0.1))]
    write_outputs(config, rows, tmp_path, seconds=2.0)
    text = (tmp_path / "report.html").read_text()
    assert "no cell has a report of its own" in text and "<ul>" not in text


def test_reports_of_one_directory_share_one_plotlyjs_that_opens_offline(tmp_path):
    """Each report of a directory (and its cells/runs below) loads the same plotly.min.js by a relative path
    that resolves to a file holding plotly.js, so the pages open without a network."""
    from plotly.offline import get_plotlyjs

    faith = {c: 0.5 for c in every_config(2)}
    result = search_result(faith, n_layers=2)
    (tmp_path / "run.json").write_text("{}")  # an af1 directory: its subfolders share its plotly.min.js
    pages = [report.search_report(result, tmp_path / "report.html"),
             report.necessity_report([0, 1], [0.5, 0.6], tmp_path / "necessity" / "report.html"),
             report.search_report(result, tmp_path / "cells" / "m" / "t" / "report.html")]
    shared = set()
    for page in pages:
        text = page.read_text()
        (src,) = re.findall(r"<script src='([^']+)'>", text)
        assert not src.startswith(("http:", "https:", "//")) and "cdn" not in src
        js = (page.parent / src).resolve()
        shared.add(js)
        assert len(text) < 100_000 and "plotly.js v" not in text
    assert shared == {(tmp_path / "plotly.min.js").resolve()}
    assert (tmp_path / "plotly.min.js").read_text() == get_plotlyjs()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("plotly.min.js")) == ["plotly.min.js"]
