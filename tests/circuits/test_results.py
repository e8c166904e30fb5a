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
from circuits.search import SearchResult, search_af1, select
from circuits.specs import PromptSpec
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
