"""``af1 sweep``: the table equals single-command runs of its cells, cells reopen alone, a killed sweep
resumes to the same table without recomputing finished configurations, a failing cell does not stop
the others."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from circuits import cli
from circuits.errors import MAX_MESSAGE, ArgumentError
from circuits.store import files
from circuits.sweep import SweepConfig

ROOT = Path(__file__).resolve().parents[2]
BASE = ["sweep", "--models", "arith-gpt2", "--tasks", "add,add_sub", "--ablations", "cama,zero", "--seeds", "0,1",
        "--n-prompts", "30", "--no-progress"]


def table(out: Path) -> list[dict[str, str]]:
    with open(out / "table.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "out"
    assert cli.main([*BASE, "--out", str(out)]) == 0
    return out


def test_table_has_every_cell(sweep_dir):
    rows = table(sweep_dir)
    assert [(r["task"], r["seed"], r["ablation"]) for r in rows] == [
        (t, s, a) for t in ("add", "add_sub") for s in ("0", "1") for a in ("cama", "zero")]
    assert all(r["status"] == "ok" and r["n_prompts"] == "30" for r in rows)
    md = (sweep_dir / "table.md").read_text()
    assert md.count("| arith-gpt2 |") == 4  # one line per (task, ablation), seeds aggregated
    html = (sweep_dir / files.REPORT).read_text()
    # one heatmap per ablation (never averaged across them), each sized to its tasks
    assert html.count('class="plotly-graph-div"') == 2 and "cells/arith-gpt2/add/cama-seed0/report.html" in html


@pytest.mark.parametrize("task,ablation,seed", [("add_sub", "cama", 1), ("add", "zero", 0)])
def test_cells_equal_single_commands(sweep_dir, tmp_path, task, ablation, seed):
    """A cell's numbers are those of `af1 search` with the same flags, and the cell reopens as that run."""
    single = tmp_path / "single"
    argv = ["search", "--model", "arith-gpt2", "--task", task, "--n-prompts", "30", "--seed", str(seed),
            "--ablation", ablation, "--grid", "full", "--no-progress"]
    assert cli.main([*argv, "--out", str(single)]) == 0
    row = next(r for r in table(sweep_dir) if (r["task"], r["ablation"], r["seed"]) == (task, ablation, str(seed)))
    results = [json.loads(line) for line in (single / files.SEARCH_RESULTS).read_text().splitlines()]
    best = max(results, key=lambda r: (r["faithfulness"], r["wait"], -r["transfer"]))
    summary = json.loads((single / files.SUMMARY).read_text())
    if summary["selected"] is not None:
        best = summary["selected"]
    assert float(row["faithfulness"]) == pytest.approx(best["faithfulness"], abs=1e-6)
    assert (int(row["wait"]), int(row["transfer"])) == (best["wait"], best["transfer"])
    assert float(row["ci_low"]) == pytest.approx(best["ci_low"], abs=1e-6)
    cell = sweep_dir / row["path"]
    assert json.loads((cell / files.IDENTITY).read_text()) == json.loads((single / files.IDENTITY).read_text())
    before = (cell / files.SEARCH_RESULTS).read_bytes()
    assert cli.main([*argv, "--out", str(cell)]) == 0  # the cell reopens alone: nothing left to compute
    assert (cell / files.SEARCH_RESULTS).read_bytes() == before


def test_killed_sweep_resumes_to_the_same_table(sweep_dir, tmp_path):
    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "circuits.cli", *BASE, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900  # a busy machine takes minutes to reach the second seed's zero cell
    target = out / "cells" / "arith-gpt2" / "add" / "zero-seed1" / files.SEARCH_RESULTS
    while proc.poll() is None and time.time() < deadline and not (target.exists() and target.stat().st_size):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "table.csv").exists()
    done = {p.parent.relative_to(out): len(p.read_text().splitlines()) for p in out.rglob(files.SEARCH_RESULTS)}
    assert len(done) < 8  # killed before the last cell
    assert cli.main([*BASE, "--out", str(out)]) == 0
    assert [{k: v for k, v in r.items() if k != "path"} for r in table(out)] == \
        [{k: v for k, v in r.items() if k != "path"} for r in table(sweep_dir)]
    assert sum(done.values()) > 28  # the kill came after at least one whole cell
    for cell in (p.parent for p in out.rglob(files.SEARCH_RESULTS)):
        n_before = done.get(cell.relative_to(out), 0)  # finished configurations were read back, not recomputed
        summary = json.loads((cell / files.SUMMARY).read_text())
        assert summary["n_resumed"] >= n_before - 1  # a line torn by the kill is recomputed
        assert summary["n_resumed"] + summary["n_evaluated_this_run"] == 28


def test_the_failed_line_states_each_reason_once_before_its_cells():
    """Cells that failed for one reason share one statement of it, before the cells, so a long list of cells (long
    model paths) cuts off cell names, never why; different reasons are listed in order."""
    from types import SimpleNamespace

    from circuits.commands.sweep import failed_line

    model = "/a/long/path/to/a/model/folder/" + "x" * 80
    why = "config.json asks for at least 1.1e+15 GB of float32 weights (n_layer=4096), more than this machine holds"
    rows = [SimpleNamespace(model=model, task="add", ablation=a, seed=0, error=why) for a in ("cama", "mean", "zero")]
    line = failed_line(rows, 3)
    assert line.startswith(f"3 of 3 cells failed: {why} ({model}/add/cama/seed 0, {model}/add/mean")
    assert line.count(why) == 1 and len(line) <= MAX_MESSAGE and line.endswith("... (see table.md)")
    rows = [SimpleNamespace(model="m", task="t", ablation="cama", seed=s, error=e) for s, e in enumerate("abcab")]
    assert failed_line(rows, 6, limit=2) == ("5 of 6 cells failed: a (m/t/cama/seed 0, m/t/cama/seed 3); "
                                             "b (m/t/cama/seed 1, m/t/cama/seed 4); and 1 more reasons (see table.md)")


def test_a_failing_cell_is_recorded_and_the_others_run(tmp_path, capsys):
    """The tables and the report are written with the failed row, then the sweep exits 2 with one line naming it."""
    out = tmp_path / "out"
    argv = ["sweep", "--models", "no-such-model-xyz,arith-gpt2", "--tasks", "add", "--n-prompts", "20",
            "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("af1 sweep: error: 1 of 2 cells failed: cannot load model "
                                               "'no-such-model-xyz'"), err
    assert err[0].endswith("(see table.md)") and len(err[0]) <= len("af1 sweep: error: ") + MAX_MESSAGE, err
    assert (out / files.REPORT).exists() and (out / files.SUMMARY).exists()
    rows = table(out)
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "cannot load model 'no-such-model-xyz'" in rows[0]["error"] and rows[1]["faithfulness"]
    assert "no-such-model-xyz" in (out / "table.md").read_text()


def test_another_threshold_into_a_finished_sweep_reselects_without_evaluating(sweep_dir, tmp_path, monkeypatch,
                                                                            counted):
    """The threshold is not part of the sweep's identity: every cell's selection is recomputed from its stored
    results (the full grid), nothing is evaluated; the prompts, fit sets and means are reloaded from the cells
    (no prompt is checked, no fit set drawn, no means fitted)."""
    import shutil

    from circuits.search import evaluators
    from circuits.search.rule import select

    out = tmp_path / "again"
    shutil.copytree(sweep_dir, out)
    calls = []
    for cls in (evaluators.FastEvaluator, evaluators.NaiveEvaluator):
        monkeypatch.setattr(cls, "evaluate", lambda self, w, t: calls.append((w, t)))
    before = {p: p.read_bytes() for p in out.rglob(files.SEARCH_RESULTS)}
    assert cli.main([*BASE, "--threshold", "0.02", "--out", str(out)]) == 0
    assert calls == [] and all(p.read_bytes() == b for p, b in before.items())
    assert counted == {"filter_correct": 0, "base_correct": 0, "draw_fit_set": 0, "MeanCache.fit": 0}
    changed = 0
    for old, new in zip(table(sweep_dir), table(out)):
        records = [json.loads(line) for line in (out / new["path"] / files.SEARCH_RESULTS).read_text().splitlines()]
        chosen = select({(r["wait"], r["transfer"]): r["faithfulness"] for r in records}, 0.02)
        assert new["selected"] == str(chosen is not None)
        if chosen is not None:
            assert (int(new["wait"]), int(new["transfer"])) == chosen
        changed += (old["wait"], old["transfer"], old["selected"]) != (new["wait"], new["transfer"], new["selected"])
    assert changed  # at 0.9 nothing is selected on these cells (the row shows the most faithful one)
    assert json.loads((out / files.SUMMARY).read_text())["config"]["threshold"] == 0.02
    from circuits.sweep.run import SweepResult

    assert SweepResult.load(out).config.threshold == 0.02


def test_a_different_sweep_into_the_same_directory_is_refused(sweep_dir, capsys):
    argv = [a if a != "0,1" else "0,1,2" for a in BASE]
    before = (sweep_dir / "table.csv").read_bytes()
    assert cli.main([*argv, "--out", str(sweep_dir)]) == 2
    assert "seeds: [0, 1] -> [0, 1, 2]" in capsys.readouterr().err
    assert (sweep_dir / "table.csv").read_bytes() == before


def test_config_file_and_groups(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[sweep]\nmodels = ["arith-styles"]\ntasks = ["add", "style"]\nseeds = [42, 123, 999]\n')
    config = SweepConfig.from_toml(path)
    assert config.tasks[0] == "add" and len(config.tasks) == 11 and "python_sub" in config.tasks
    assert len(list(config.cells())) == 33
    for bad, msg in [({"models": ["m"], "tasks": ["add"], "mode": "fixed"}, "needs wait and transfer"),
                     ({"models": ["m"], "tasks": ["nope"]}, "task 'nope' is unknown"),
                     ({"models": ["m"], "tasks": ["add"], "ablations": ["median"]}, "ablation='median' is not valid"),
                     ({"models": ["m"], "tasks": ["add"], "colour": 1}, "unknown sweep key(s) colour"),
                     ({"tasks": ["add"]}, "needs `models = [...]`")]:
        with pytest.raises(ArgumentError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            SweepConfig.from_mapping(bad)


@pytest.mark.parametrize("example", ["styles.toml", "zoo_models.toml", "paper_models.toml"])
def test_shipped_examples_parse(example):
    from importlib.resources import files as resources

    text = (resources("circuits.sweep") / "examples" / example).read_text()
    import tomllib

    assert SweepConfig.from_mapping(tomllib.loads(text)["sweep"]).models
