"""``af1 edges`` end to end through ``cli.main``: files, reopening, the MIB export and the one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from circuits import cli, results
from circuits.edges.circuit import af1_allowed
from circuits.edges.result import EdgesResult
from tests.circuits.test_cli import tiny_loading  # noqa: F401  (the fixture)


def test_edges_command(tiny_loading, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "e"
    argv = ["edges", "--model", "tiny", "--task", "t", "--n-prompts", "12", "--counterfactual", "cama",
            "--steps", "3", "--wait", "0", "--transfer", "2", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "CPR" in printed and "top edges" in printed
    for name in ("edges.json", "edges.npz", "mib.json", "report.html", "run.json"):
        assert (out / name).is_file(), name
    r = results.load(out)
    assert isinstance(r, EdgesResult)
    frame = r.to_pandas()
    assert list(frame.columns[:6]) == ["src", "src_pos", "dst", "dst_pos", "input", "score"]
    assert len(frame) == r.layout.n_edges() and (frame["src_pos"] <= frame["dst_pos"]).all()
    assert int(frame["candidate"].sum()) == sum(int(v.sum()) for v in af1_allowed(r.layout, 0, 2).values())
    cross = frame[(frame["src_pos"] != frame["dst_pos"]) & (frame["src_pos"] > 0) & frame["candidate"]]
    assert set(cross["dst_pos"]) == {r.layout.n_pos - 1} and set(cross["dst"].str[1]) <= {"1", "2"}
    assert np.abs(frame["score"]).max() > 0 and r.curve is not None and len(r.curve.points) == 10
    assert r.curve.points[-1].faithfulness == pytest.approx(
        (r.curve.points[-1].mean_metric - r.curve.empty) / (r.curve.full - r.curve.empty))
    mib = json.loads((out / "mib.json").read_text())
    assert set(mib) == {"cfg", "nodes", "edges"} and "input->a0.h0<q>" in mib["edges"]
    assert sum(e["score"] for e in mib["edges"].values()) == pytest.approx(float(frame["score"].sum()), rel=1e-6)
    assert r.plot() is not None
    # a finished directory with other settings is refused, with a one-line error
    assert cli.main([("5" if a == "3" else a) for a in argv]) == 2
    assert "edges_steps" in capsys.readouterr().err


def test_edges_aggregated_positions(tiny_loading, tmp_path):  # noqa: F811
    out = tmp_path / "a"
    assert cli.main(["edges", "--model", "tiny", "--task", "t", "--n-prompts", "8", "--counterfactual", "zero",
                     "--method", "eap", "--aggregate-positions", "--no-curve", "--no-progress", "--out", str(out)]) == 0
    r = results.load(out)
    assert (r.to_pandas()["src_pos"] == -1).all() and r.curve is None


@pytest.mark.parametrize("extra, message", [
    (["--wait", "0"], "--wait and --transfer together"),
    (["--backend", "nnsight", "--remote"], "without --remote"),
    (["--wait", "0", "--transfer", "1", "--aggregate-positions"], "leave out --aggregate-positions"),
    (["--steps", "0"], "--steps"),
])
def test_edges_bad_input_is_one_line(tiny_loading, tmp_path, capsys, extra, message):  # noqa: F811
    code = cli.main(["edges", "--model", "tiny", "--task", "t", "--out", str(tmp_path / "x"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_edges_runs_as_a_sweep_cell(tiny_loading, tmp_path):  # noqa: F811
    """``analyses = ["edges"]``: a cell per model, task and seed; its row's faithfulness is the CPR, its folder
    reopens as an EdgesResult (the sweep's wait/transfer restrict the candidates to that AF1 subgraph)."""
    from circuits.sweep import SweepConfig, run_sweep

    config = SweepConfig.from_mapping({"models": ["tiny"], "tasks": ["add"], "ablations": ["zero"],
                                       "mode": "fixed", "wait": 1, "transfer": 1, "n_prompts": 8,
                                       "analyses": ["edges"]})
    rows = run_sweep(config, tmp_path / "sweep", progress=False)
    row = next(r for r in rows if r.ablation == "edges")
    assert row.status == "ok", row.error
    r = results.load(tmp_path / "sweep" / row.path)
    assert isinstance(r, EdgesResult) and r.config["wait"] == 1 and r.curve is not None
    assert row.faithfulness == pytest.approx(r.curve.cpr)
