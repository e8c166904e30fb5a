"""``af1 compare`` and ``circuits.results.compare``: real search, fixed-sweep and necessity runs of the zoo models
side by side, their numbers read back against each run's own files, and runs that do not compare refused in one
line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from circuits import cli, results
from circuits.errors import ArgumentError
from circuits.store import files

SMALL = ["--n-prompts", "12", "--no-progress"]
FIT = ["--fit-size", "300"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two searches (arith-gpt2 and arith-llama on add), a fixed two-model sweep on add, two necessity runs on add and
    a search on sub."""
    root = tmp_path_factory.mktemp("compare")
    out = {name: root / name for name in ("gpt2", "llama", "sweep", "nec_gpt2", "nec_llama", "sub")}
    for name, model, task in (("gpt2", "arith-gpt2", "add"), ("llama", "arith-llama", "add"),
                              ("sub", "arith-gpt2", "sub")):
        assert cli.main(["search", "--model", model, "--task", task, *SMALL, *FIT, "--grid", "auto",
                         "--out", str(out[name])]) == 0
    for name, model in (("nec_gpt2", "arith-gpt2"), ("nec_llama", "arith-llama")):
        assert cli.main(["necessity", "--model", model, "--task", "add", *SMALL, "--out", str(out[name])]) == 0
    config = root / "sweep.toml"
    config.write_text('[sweep]\nmodels = ["arith-gpt2", "arith-llama"]\ntasks = ["add"]\nablations = ["cama", "zero"]\n'
                      'mode = "fixed"\nwait = 3\ntransfer = 1\nn_prompts = 12\nfit_size = 300\n')
    assert cli.main(["sweep", "--config", str(config), "--no-progress", "--out", str(out["sweep"])]) == 0
    return out


def test_search_and_sweep_runs_side_by_side(runs, tmp_path, capsys):
    c = results.compare([runs["gpt2"], runs["llama"], runs["sweep"]])
    frame = c.to_pandas()
    assert c.metric == "af1"
    assert list(frame["run"]) == [str(runs["gpt2"]), str(runs["llama"])] + [str(runs["sweep"])] * 4
    for i, name in enumerate(("gpt2", "llama")):  # a search: its selected configuration, else its most faithful one
        summary = json.loads((runs[name] / files.SUMMARY).read_text())
        records = [json.loads(x) for x in (runs[name] / files.SEARCH_RESULTS).read_text().splitlines()]
        best = summary["selected"] or max(records, key=lambda r: (r["faithfulness"], r["wait"], -r["transfer"]))
        row = frame.iloc[i]
        assert (row["model"], row["task"], row["wait"], row["transfer"]) == (summary["model"], "add", best["wait"],
                                                                             best["transfer"])
        assert (row["faithfulness"], row["ci_low"], row["ci_high"]) == pytest.approx(
            (best["faithfulness"], best["ci_low"], best["ci_high"]))
        assert bool(row["selected"]) == (summary["selected"] is not None)
    with open(runs["sweep"] / files.TABLE_CSV) as f:
        table = list(csv.DictReader(f))
    cells = frame.iloc[2:]
    assert list(cells["cell"]) == [f"{r['model']}/{r['task']}/{r['ablation']}/seed {r['seed']}" for r in table]
    assert list(cells["faithfulness"]) == pytest.approx([float(r["faithfulness"]) for r in table], abs=1e-6)
    assert set(cells["item"]) == {"wait=3, transfer=1"} and cells["selected"].isna().all()
    # the figure: one trace per ablation, every row once, its 95% interval as error bars
    fig = c.plot()
    assert [t.name for t in fig.data] == ["cama ablation", "zero ablation"]
    assert sum(len(t.y) for t in fig.data) == len(frame)
    cama = frame[frame["ablation"] == "cama"]
    assert list(fig.data[0].error_y.array) == pytest.approx(list(cama["ci_high"] - cama["faithfulness"]))
    # the command prints the same table and writes it with the figure
    assert cli.main(["compare", str(runs["gpt2"]), str(runs["llama"]), str(runs["sweep"]), "--out",
                     str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(c.text()) and "faithfulness [95% CI]" in printed
    with open(tmp_path / "cmp" / files.COMPARE_CSV) as f:
        written = list(csv.DictReader(f))
    assert [float(r["faithfulness"]) for r in written] == pytest.approx(list(frame["faithfulness"]))
    assert 'class="plotly-graph-div"' in (tmp_path / "cmp" / files.REPORT).read_text()


def test_necessity_runs_side_by_side(runs):
    c = results.compare([runs["nec_gpt2"], runs["nec_llama"]])
    wide = c.side_by_side()
    assert c.metric == "necessity" and list(wide.columns) == [str(runs["nec_gpt2"]), str(runs["nec_llama"])]
    for name in ("nec_gpt2", "nec_llama"):
        blocks = json.loads((runs[name] / files.NECESSITY_SUMMARY).read_text())["blocks"]
        assert list(wide[str(runs[name])]) == pytest.approx([b["faithfulness"] for b in blocks])
        assert list(wide.index) == [b["layer"] for b in blocks]
    fig = c.plot()
    assert len(fig.data) == 2 and "arith-llama" in fig.data[1].name
    lines = c.text().splitlines()  # a line per block, a column per run
    assert lines[0].split() == ["block", str(runs["nec_gpt2"]), str(runs["nec_llama"])]
    assert lines[1].split() == ["arith-gpt2", "arith-llama"] and len(lines) == 2 + len(wide)
    b = json.loads((runs["nec_llama"] / files.NECESSITY_SUMMARY).read_text())["blocks"][0]
    assert lines[2].endswith(f"{b['faithfulness']:.3f} [{b['ci_low']:.3f}, {b['ci_high']:.3f}]")


@pytest.mark.parametrize(("names", "why"), [
    (("gpt2", "nec_gpt2"), "different measures"),
    (("gpt2", "sub"), r"\(task add\) with .* \(task sub\): different tasks"),
    (("sweep", "sub"), "different tasks"),
    (("gpt2", "gpt2"), "is given twice"),
    (("gpt2",), "at least two runs"),
])
def test_runs_that_do_not_compare_are_refused_in_one_line(runs, names, why, capsys):
    with pytest.raises(ArgumentError, match=why):
        results.compare([runs[n] for n in names])
    assert cli.main(["compare", *[str(runs[n]) for n in names]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("af1 compare: error: ")


def test_compare_refuses_what_is_not_a_run_and_an_out_that_is_one(runs, tmp_path, capsys):
    assert cli.main(["compare", str(runs["gpt2"]), str(tmp_path)]) == 2
    assert "is not an af1 output directory" in capsys.readouterr().err
    assert cli.main(["compare", str(runs["gpt2"]), str(runs["llama"]), "--out", str(runs["sweep"])]) == 2
    assert "holds run.json" in capsys.readouterr().err
    assert not (runs["sweep"] / files.COMPARE_CSV).exists()
    other = tmp_path / "pages"
    other.mkdir()
    (other / files.REPORT).write_text("mine")
    assert cli.main(["compare", str(runs["gpt2"]), str(runs["llama"]), "--out", str(other)]) == 2
    assert "report.html that no comparison wrote" in capsys.readouterr().err and (other / files.REPORT).read_text() == \
        "mine"
    # an earlier comparison is replaced
    again = tmp_path / "again"
    for _ in range(2):
        assert cli.main(["compare", str(runs["gpt2"]), str(runs["llama"]), "--out", str(again)]) == 0
    assert len((again / files.COMPARE_CSV).read_text().splitlines()) == 3


def test_a_fixed_run_compares_and_other_kinds_are_refused(runs):
    from circuits.results.comparison import rows_of

    cell = runs["sweep"] / "cells" / "arith-llama" / "add" / "zero-seed0"  # a sweep cell: a run of its own (fixed)
    c = results.compare([runs["gpt2"], cell])
    row = c.to_pandas().iloc[1]
    summary = json.loads((cell / files.SUMMARY).read_text())
    assert (row["command"], row["model"], row["ablation"], row["item"]) == ("fixed", "arith-llama", "zero",
                                                                             "wait=3, transfer=1")
    assert row["selected"] is None
    assert (row["faithfulness"], row["ci_low"], row["ci_high"], row["base_accuracy"]) == pytest.approx(
        (summary["result"]["faithfulness"], summary["result"]["ci_low"], summary["result"]["ci_high"],
         summary["base_accuracy"]))
    for kind in ("prune", "lens", "groundtruth"):
        with pytest.raises(ArgumentError, match=f"x is an af1 {kind} run: af1 compare reads search, fixed, sweep"):
            rows_of("x", kind, {}, None)
