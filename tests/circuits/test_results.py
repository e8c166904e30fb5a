"""Results are objects: a run directory reopened without a model equals the in-memory result, tables and the
report's figures come from it, the threshold only changes the selection, and the command line and the Python
API share their directories."""

from __future__ import annotations

import json
import math
from dataclasses import fields

import numpy as np
import pytest

from circuits import cli
from circuits.prompts.spec import PromptSpec
from circuits.search import SearchResult, search_af1, select
from tests.circuits.test_cli import tiny_loading  # noqa: F401 - the fixture
from tests.circuits.test_search import small_case


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assert_same_search(loaded: SearchResult, mem: SearchResult) -> None:
    for f in fields(SearchResult):
        assert same(getattr(loaded, f.name), getattr(mem, f.name)), f.name
    for a, b in zip(loaded.results, mem.results):
        assert a.outcomes == b.outcomes and a.outcomes is not None


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    model, tokens, answers, fit = small_case()
    out = tmp_path_factory.mktemp("search") / "run"
    mem = search_af1(model, tokens, answers, fit_tokens=fit, grid="full", threshold=0.5, out_dir=out, progress=False,
                     n_boot=10, meta={"model": "tiny", "task": "random"})
    return model, tokens, answers, fit, out, mem


def test_search_reopened_equals_in_memory(searched):
    *_, out, mem = searched
    loaded = SearchResult.load(out)
    assert len(loaded.results) == 15 and loaded.n_evaluated == 15 and loaded.prompts == mem.prompts
    assert_same_search(loaded, mem)


def test_search_prompt_outcomes_match_the_aggregates(searched):
    *_, out, mem = searched
    loaded = SearchResult.load(out)
    for r in mem.results:
        o = loaded.prompt_outcomes(r.wait, r.transfer)
        assert o.n == r.n == 32 and int(o.faithful.sum()) == r.n_faithful
        assert o.answer_prob.mean() == pytest.approx(r.mean_answer_prob, abs=1e-6)
        assert o.logit_diff.mean() == pytest.approx(r.mean_logit_diff, abs=1e-6)
        assert np.array_equal(o.faithful, o.logit_diff > 0)
        assert o.flipped() == [i for i in range(32) if not o.faithful[i]]
        assert o.prompts == mem.prompts
    with pytest.raises(KeyError, match="not evaluated"):
        loaded.prompt_outcomes(3, 5)


def test_search_table_and_figures(searched):
    *_, out, mem = searched
    loaded = SearchResult.load(out)
    df = loaded.to_pandas()
    assert len(df) == 15 and list(df["faithfulness"]) == [r.faithfulness for r in mem.results]
    assert int(df["selected"].sum()) == (mem.selected is not None)
    heat = loaded.plot()
    assert heat.to_plotly_json()["data"][0]["z"] == mem.plot_heatmap().to_plotly_json()["data"][0]["z"]
    assert [f.layout.title.text for f in loaded.figures()] == [f.layout.title.text for f in mem.figures()]
    per = loaded.prompt_outcomes(0, 1).to_pandas()
    assert list(per.columns) == ["index", "prompt", "faithful", "answer_prob", "logit_diff"] and len(per) == 32


def test_threshold_change_recomputes_nothing(searched, monkeypatch):
    model, tokens, answers, fit, out, mem = searched
    before = (out / "results.jsonl").read_bytes()
    # an earlier release recorded the threshold in run.json: such a directory resumes too
    ident = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**ident, "threshold": 0.5}))
    calls = []
    from circuits.search import evaluators

    for cls in (evaluators.FastEvaluator, evaluators.NaiveEvaluator):
        monkeypatch.setattr(cls, "evaluate", lambda self, w, t: calls.append((w, t)))
    faith = mem.faithfulness_map()
    for threshold in (0.2, 0.9):
        again = search_af1(model, tokens, answers, fit_tokens=fit, grid="full", threshold=threshold, out_dir=out,
                           progress=False, n_boot=10, meta={"model": "tiny", "task": "random"})
        assert calls == [] and again.n_evaluated == 0 and again.n_resumed == 15
        chosen = select(faith, threshold)
        assert (again.selected.config if again.selected else None) == chosen
        assert (out / "results.jsonl").read_bytes() == before
        summary = json.loads((out / "summary.json").read_text())
        assert summary["threshold"] == threshold and summary["n_evaluated_this_run"] == 0
        assert SearchResult.load(out).selected == again.selected
        assert mem.with_threshold(threshold).selected == again.selected


def test_cli_run_resumed_from_python_and_back(tiny_loading, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "cli"
    argv = ["search", "--model", "tiny", "--task", "t", "--n-prompts", "20", "--grid", "full", "--threshold", "0.5",
            "--no-progress", "--out"]
    assert cli.main(argv + [str(out)]) == 0
    prompts = PromptSpec("t", n_prompts=20).prepare(tiny_loading, means="cama", progress=False)
    py = search_af1(tiny_loading, prompts.tokens, prompts.answers, fit=prompts.fit, grid="full", threshold=0.5,
                    out_dir=out, progress=False, prompts=prompts.records())
    assert py.n_evaluated == 0 and py.n_resumed == 15
    assert_same_search(SearchResult.load(out), py)
    # the reverse: a directory of the Python API resumed by the command line
    out2 = tmp_path / "py"
    search_af1(tiny_loading, prompts.tokens, prompts.answers, fit=prompts.fit, grid="full", threshold=0.5,
               out_dir=out2, progress=False, prompts=prompts.records())
    capsys.readouterr()
    assert cli.main(argv + [str(out2)]) == 0
    assert "resumed 15 configuration(s)" in capsys.readouterr().out


def assert_same_fields(loaded, mem, skip=()):
    for f in fields(type(mem)):
        if f.name in skip:
            continue
        a, b = getattr(loaded, f.name), getattr(mem, f.name)
        if isinstance(b, np.ndarray):
            assert np.array_equal(a, b, equal_nan=True), f.name
        else:
            assert same(a, b), f.name


def test_necessity_reopened_equals_in_memory(tmp_path):
    from circuits.necessity import NecessityResult, necessity_sweep
    from circuits.results import load

    model, tokens, answers, _ = small_case()
    mem = necessity_sweep(model, tokens, answers, out_dir=tmp_path / "n", progress=False, n_boot=10)
    loaded = load(tmp_path / "n")
    assert isinstance(loaded, NecessityResult) and len(loaded.blocks) == 4
    assert_same_fields(loaded, mem)
    df = loaded.to_pandas()
    assert list(df["layer"]) == [0, 1, 2, 3] and list(df["faithfulness"]) == [b.faithfulness for b in mem.blocks]
    assert list(loaded.plot().data[0].y) == [b.faithfulness for b in mem.blocks]


def test_prune_reopened_equals_in_memory(tmp_path):
    import torch

    from circuits.prune import PruneResult, prune_heads
    from tests.circuits.test_prune import setup
    from tests.conftest import build_default

    torch.manual_seed(0)
    model = build_default("llama")
    tokens, cache, answers = setup(model, n=24)
    mem = prune_heads(model, tokens, answers, wait=0, transfer=2, cache=cache, progress=False, batch_size=64,
                      n_boot=10, target=0.75, out_dir=tmp_path / "p")
    loaded = PruneResult.load(tmp_path / "p")
    assert len(loaded.curve) == 9 and loaded.removal_order == mem.removal_order
    assert_same_fields(loaded, mem)
    df = loaded.to_pandas()
    assert list(df["n_heads_kept"]) == list(range(8, -1, -1))
    assert list(df["faithfulness"]) == [p.faithfulness for p in mem.curve]
    assert [f.layout.title.text for f in loaded.figures()] == [f.layout.title.text for f in mem.figures()]
    assert list(loaded.plot().data[0].y) == [p.faithfulness for p in mem.curve]


def test_lens_reopened_equals_in_memory(tmp_path):
    from circuits import lens
    from circuits.lens.report import write_lens_outputs
    from circuits.lens.result import LensResult
    from tests.circuits.test_lens import small_lens_case

    model, tokens, answers, mem = small_lens_case("llama")
    ix = lens.interchange(model, tokens, answers, tokens.flip(0), counter_answers=answers.flip(0), label="swap",
                          progress=False)
    write_lens_outputs(tmp_path / "l", mem, interchanges=[ix], meta={"model": "tiny"})
    loaded = LensResult.load(tmp_path / "l")
    assert_same_fields(loaded, mem, skip=("interchanges",))
    (got,) = loaded.interchanges
    assert got.label == "swap" and got.layers == ix.layers and np.allclose(got.drop, ix.drop)
    doc = json.loads((tmp_path / "l" / "lens.json").read_text())
    assert loaded.to_pandas()["answer_prob"].tolist() == pytest.approx([r["answer_prob"] for r in doc["rows"]])
    assert len(loaded.to_pandas(per_prompt=True)) == 4 * len(mem.labels())
    figs = loaded.figures()
    assert len(figs) == len(mem.figures()) and figs[-1].layout.title.text.startswith("Interchange")
    rank = loaded.plot("answer_rank")
    assert rank.layout.yaxis.type == "log" and min(v for v in rank.data[0].y if v is not None) >= 1
    assert loaded.plot("answer_prob").layout.yaxis.range == (-0.02, 1.02)


def test_sweep_reopened_and_one_heatmap_per_ablation(tmp_path):
    from circuits.sweep import SweepConfig, SweepResult
    from circuits.sweep.run import CellResult
    from circuits.sweep.table import write_outputs

    config = SweepConfig(models=("m",), tasks=("add", "add_sub"), ablations=("cama", "zero"), seeds=(0,))
    cells = [CellResult("m", t, a, 0, base_accuracy=0.9, n_prompts=20, wait=0, transfer=1, faithfulness=f, selected=True,
                        faith_by_wait={"0": f, "-1": 0.0}, path=f"cells/{t}-{a}")
             for t, a, f in [("add", "cama", 0.16), ("add", "zero", 0.02), ("add_sub", "cama", 0.5),
                             ("add_sub", "zero", 0.25)]]
    write_outputs(config, cells, tmp_path, seconds=1.5)
    loaded = SweepResult.load(tmp_path)
    assert loaded.config == config and loaded.cells == cells and loaded.seconds == 1.5
    assert list(loaded.to_pandas()["faithfulness"]) == [0.16, 0.02, 0.5, 0.25]
    heat = loaded.figures()
    assert len(heat) == 2 and ["cama" in h.layout.title.text for h in heat] == [True, False]
    assert heat[0].data[0].z[0][0] == 0.16 and heat[1].data[0].z[0][0] == 0.02  # never mean(0.16, 0.02)
    assert heat[0].layout.height >= 300
    assert loaded.plot(ablation="zero").data[0].z[1][0] == 0.25


def test_groundtruth_reopened(tmp_path):
    from circuits.groundtruth.recovery import Recovery
    from circuits.groundtruth.report import GroundTruthResult, table_rows, write_outputs
    from circuits.results import load

    rows = [Recovery(model="gt", task="add_sub", ablation=a, n_prompts=20, planted=(2, 2), selected=(2, 2),
                     faithfulness_planted=0.95, pruned_at=(2, 2), planted_heads=[(3, 0), (4, 1)],
                     found_heads=[(3, 0), (4, 1)], precision=1.0, recall=1.0, cpr=0.6, cmd=0.4, target=0.9,
                     curve=[(0, 0.1), (4, 0.9), (8, 1.0)]) for a in ("cama", "zero")]
    write_outputs(rows, tmp_path)
    loaded = load(tmp_path)
    assert isinstance(loaded, GroundTruthResult) and loaded.rows == rows
    assert loaded.to_pandas().to_dict("records") == table_rows(rows)
    assert len(loaded.plot().data) == 2 and len(loaded.figures()) == 1


def test_to_pandas_without_pandas_says_so(monkeypatch, searched):
    import sys

    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="to_pandas\\(\\) needs pandas.*pip install pandas"):
        SearchResult.load(searched[4]).to_pandas()


def test_reports_share_one_plotlyjs(tmp_path, monkeypatch, searched):
    import re

    from circuits import report

    mem = searched[-1]
    report.search_report(mem, tmp_path / "a" / "report.html")
    report.search_report(mem, tmp_path / "a" / "other.html")
    report.search_report(mem, tmp_path / "a" / "cells" / "c1" / "report.html")  # a cell under a sweep's root
    js = tmp_path / "a" / "plotly.min.js"
    assert "plotly.js v" in js.read_text() and sorted(p.name for p in tmp_path.rglob("plotly.min.js")) == [js.name]
    for page, src in (("report.html", "plotly.min.js"), ("other.html", "plotly.min.js"),
                      ("cells/c1/report.html", "../../plotly.min.js")):
        text = (tmp_path / "a" / page).read_text()
        assert f"<script src='{src}'>" in text and len(text) < 200_000 and "plotly.js v" not in text
    monkeypatch.setenv("AF1_PLOTLYJS", "embed")
    text = report.search_report(mem, tmp_path / "b" / "report.html").read_text()
    assert "plotly.js v" in text and not re.search(r"<script src=", text) and not (tmp_path / "b" / "plotly.min.js").exists()
