"""benchmarks/report_screenshots.py: its checks on figure descriptions (always), and, where Chromium is installed
(``/usr/bin/chromium``; CI does not install it), every kind of report figure rendered in headless Chromium from
small results: they draw, read (no check fails) and are screenshotted; pages that do not read are caught (a
script error, a missing plotly.min.js, an empty figure, overlapping tick labels, a raw field name on an axis, a
legend over an axis title, a cut-off title)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "report_screenshots.py"
CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.is_file(), reason="no /usr/bin/chromium (apt-get install chromium): the browser check is skipped")


def load_script():
    spec = importlib.util.spec_from_file_location("report_screenshots", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("report_screenshots", module)
    spec.loader.exec_module(module)
    return module


def described(**over):
    """One figure as the page script describes it, reading well unless ``over`` says otherwise."""
    f = {"id": "fig0", "title": "A figure", "rendered": True, "width": 700.0, "height": 400.0, "traces": 1,
         "withData": 1, "annotations": [], "axisTitles": {"xaxis": "wait", "yaxis": "faithfulness"},
         "ticks": {"xaxis": [[10, 300, 20, 310], [30, 300, 40, 310]], "yaxis": []}, "box": [0, 0, 700, 400],
         "titleBox": [20, 5, 300, 25], "legendBox": None, "labelBoxes": [[100, 350, 200, 365]]}
    f.update(over)
    return f


def test_the_checks_catch_what_does_not_read():
    rs = load_script()
    assert rs.problems_of([described()]) == []
    cases = {
        "not rendered": described(rendered=False),
        "empty, and no annotation says why": described(withData=0),
        "px tall": described(height=2520.0),
        "overlapping tick labels on xaxis": described(ticks={"xaxis": [[10, 300, 60, 310], [40, 302, 90, 312]]}),
        "raw field name 'answer_prob'": described(axisTitles={"xaxis": "answer_prob", "yaxis": "share"}),
        "the title is cut off": described(titleBox=[20, 5, 760, 25]),
        "the legend covers": described(legendBox=[90, 340, 300, 380]),
        "no title on xaxis": described(axisTitles={"xaxis": " ", "yaxis": "faithfulness"}),
    }
    for message, figure in cases.items():
        (problem,) = rs.problems_of([figure])
        assert message in problem, (message, problem)
    # An empty figure whose annotation says why reads; labels that only touch do not overlap.
    assert rs.problems_of([described(withData=0, annotations=["nothing reaches faithfulness 0.9"])]) == []
    assert not rs.overlaps([[0, 0, 10, 10], [10, 0, 20, 10]]) and rs.overlaps([[0, 0, 10, 10], [8, 2, 20, 12]])


def test_without_chromium_the_script_says_how_to_get_it(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--chromium", str(tmp_path / "none"), "--pages", "x.html"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "apt-get install chromium" in done.stderr and "Traceback" not in done.stderr


def pages(folder: Path) -> dict[str, Path]:
    """A page per report kind, written by the report code from small results (no model)."""
    import numpy as np

    from circuits import report
    from circuits.groundtruth.recovery import Recovery
    from circuits.groundtruth.report import write_outputs as write_groundtruth
    from circuits.lens.interchange_check import InterchangeResult
    from circuits.lens.report import figures as lens_figures
    from circuits.prune.report import figures as prune_figures
    from circuits.sweep import SweepConfig
    from circuits.sweep.run import CellResult
    from circuits.sweep.table import write_outputs as write_sweep
    from tests.circuits.test_figures import every_config, prune_result, search_result
    from tests.circuits.test_lens import small_lens_case

    out = {}
    faith = {c: (1.0 if c[0] <= 1 and sum(c) >= 2 else 0.1) for c in every_config(4)}
    out["search"] = report.search_report(search_result(faith, n_layers=4), folder / "search" / "report.html")
    out["search-none"] = report.search_report(search_result({c: 0.2 for c in every_config(4)}, n_layers=4),
                                              folder / "none" / "report.html")
    out["necessity"] = report.necessity_report([0, 1, 2, 3], [0.05, 0.4, 0.9, 1.0],
                                               folder / "necessity" / "report.html",
                                               ci=[(0.0, 0.1), (0.3, 0.5), (0.85, 0.95), (1.0, 1.0)])
    kept = [(1, 1), (2, 3), (3, 0)]
    out["prune"] = report.write_page(folder / "prune" / "report.html", "prune",
                                     prune_figures(prune_result(kept, layers=3)))
    *_, result = small_lens_case("gpt2")
    ix = InterchangeResult([0, 1], np.array([0.9, 0.8]), np.array([[0.7, 0.6], [0.6, 0.5]]),
                           np.ones((2, 2), bool), None, None, "swap")
    out["lens"] = report.write_page(folder / "lens" / "report.html", "lens", lens_figures(result, [ix], n_boot=20))
    tasks = ("add", "sub", "add_sub", "verbal_add", "question_add", "python_sub")
    config = SweepConfig(models=("m",), tasks=tasks, ablations=("cama", "zero"), seeds=(0,))
    by_wait = lambda i: {str(w): round(0.15 * (3 - w) + 0.05 * i, 2) for w in range(-1, 4)}  # noqa: E731
    cells = [CellResult("m", t, a, 0, base_accuracy=0.9, n_prompts=20, wait=1, transfer=1, faithfulness=0.9,
                        selected=True, faith_by_wait=by_wait(i), path=f"cells/m/{t}/{a}-seed0")
             for i, t in enumerate(tasks) for a in ("cama", "zero")]
    write_sweep(config, cells, folder / "sweep", seconds=1.0)
    out["sweep"] = folder / "sweep" / "report.html"
    fixed = SweepConfig(models=("m",), tasks=tasks, ablations=("cama", "zero"), seeds=(0,), wait=1, transfer=1,
                        mode="fixed")
    write_sweep(fixed, cells, folder / "fixed", seconds=1.0)
    out["sweep-fixed"] = folder / "fixed" / "report.html"
    rows = [Recovery(model="gt", task="add_sub", ablation=a, n_prompts=20, planted=(2, 2), selected=(2, 2),
                     faithfulness_planted=0.95, pruned_at=(2, 2), planted_heads=[(3, 0), (4, 1)],
                     found_heads=[(3, 0), (4, 1)], precision=1.0, recall=1.0, cpr=0.6, cmd=0.4, target=0.9,
                     curve=[(0, 0.1), (4, 0.9), (8, 1.0)]) for a in ("cama", "zero")]
    out["groundtruth"] = write_groundtruth(rows, folder / "groundtruth")["html"]
    return out


@needs_chromium
def test_every_report_kind_reads_in_chromium(tmp_path):
    rs = load_script()
    written = pages(tmp_path / "runs")
    shots = tmp_path / "shots"
    result = rs.check_pages(list(written.values()), shots, tmp_path / "runs", per_figure=True)
    assert result == {str(p): [] for p in written.values()}
    pngs = sorted(p.name for p in shots.glob("*.png"))
    for kind, page in written.items():
        png = shots / rs.png_name(page, tmp_path / "runs")
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", kind
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width == rs.WIDTH and height >= 400, (kind, width, height)
    assert "search--fig0.png" in pngs and "lens--fig7.png" in pngs  # one per figure too


@needs_chromium
def test_pages_that_do_not_read_fail_in_chromium(tmp_path):
    import plotly.graph_objects as go

    from circuits import report

    rs = load_script()
    empty = go.Figure(go.Bar(x=[0, 1], y=[None, None]))
    raw = go.Figure(go.Scatter(x=[0, 1], y=[0.5, 0.6]))
    raw.update_layout(yaxis_title="answer_prob", xaxis_title="block")
    crowded = go.Figure(go.Bar(x=[f"a long category label {i}" for i in range(30)], y=list(range(30))))
    crowded.update_layout(width=400, xaxis=dict(tickangle=0), xaxis_title="category", yaxis_title="value")
    bad = report.write_page(tmp_path / "bad" / "report.html", "bad", [empty, raw, crowded])
    broken = report.write_page(tmp_path / "broken" / "report.html", "broken", [raw])
    broken.write_text(broken.read_text().replace("<body", "<body onload=\"undefinedFunction()\""))
    missing = report.write_page(tmp_path / "missing" / "report.html", "missing", [raw])
    (tmp_path / "missing" / "plotly.min.js").unlink()
    result = rs.check_pages([bad, broken, missing], None, tmp_path)
    text = {Path(p).parent.name: " | ".join(v) for p, v in result.items()}
    assert "fig0 (untitled): empty, and no annotation says why" in text["bad"]
    assert "raw field name 'answer_prob' as the yaxis title" in text["bad"]
    assert "fig2 (untitled): overlapping tick labels on xaxis" in text["bad"]
    assert "undefinedFunction is not defined" in text["broken"]
    assert "plotly.min.js" in text["missing"] or "no figure drew" in text["missing"]
