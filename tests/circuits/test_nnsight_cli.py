"""``--backend nnsight`` and ``--remote`` on the command line.

The remote runs here use nnsight's serverless dry run (``remote="local"``: each request is serialised as
for NDIF, rebuilt with the project's modules hidden and run in this process) on a zoo model, standing in
for NDIF, which cannot be reached from the tests."""

from __future__ import annotations

import json
import re

import pytest

from circuits import cli
from circuits.commands import common
from circuits.models import loading

pytest.importorskip("nnsight", reason="nnsight is not installed: pip install 'af1-circuits[nnsight]'")
zoo = pytest.importorskip("circuits.zoo")

SEARCH = ["search", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "24", "--grid", "full",
          "--no-progress", "--batch-size", "16", "--fit-size", "64"]


def results(out) -> dict:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {(r["wait"], r["transfer"]): (r["n_faithful"], r["ci_low"], r["ci_high"]) for r in rows}


def test_search_on_nnsight_equals_the_bridge(tmp_path, capsys):
    assert cli.main([*SEARCH, "--backend", "bridge", "--out", str(tmp_path / "b")]) == 0
    assert cli.main([*SEARCH, "--backend", "nnsight", "--out", str(tmp_path / "n")]) == 0
    assert results(tmp_path / "n") == results(tmp_path / "b") and len(results(tmp_path / "b")) == 28
    summary = json.loads((tmp_path / "n" / "summary.json").read_text())
    assert summary["selected"] == json.loads((tmp_path / "b" / "summary.json").read_text())["selected"]


@pytest.mark.parametrize("extra,message", [
    (["--backend", "bridge"], "--remote runs on NDIF through nnsight: add --backend nnsight"),
    (["--backend", "nnsight"], "--remote: arith-gpt2 is a zoo model, which NDIF does not host"),
])
def test_remote_is_checked_before_loading(extra, message, tmp_path, capsys):
    assert cli.main([*SEARCH, *extra, "--remote", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"af1 search: error: {message}") and err.count("\n") == 1


def test_remote_needs_the_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "zoo_names", lambda: [])  # as for a model NDIF hosts
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    assert cli.main([*SEARCH, "--backend", "nnsight", "--remote", "--out", str(tmp_path / "r")]) == 2
    assert "--remote needs an NDIF API key in the environment: export NDIF_API_KEY=..." in capsys.readouterr().err


class RemoteError(Exception):
    """Stands in for nnsight's RemoteError (a failed NDIF job)."""


@pytest.fixture
def dry_run_remote(monkeypatch):
    """``--remote`` loads the zoo model in nnsight with the serverless dry run; ``fail_after[0] = k`` makes
    the k-th request from then on fail like a failed NDIF job."""
    model = zoo.load("arith-gpt2", backend="nnsight")
    model.remote = "local"
    fail_after = [None]
    run = model.run

    def flaky(invokes):
        if fail_after[0] is not None:
            fail_after[0] -= 1
            if fail_after[0] < 0:
                raise RemoteError("job failed on the server")
        return run(invokes)

    object.__setattr__(model, "run", flaky)
    monkeypatch.setattr(common, "check_backend", lambda *args: None)  # zoo model: the dry run stands in for NDIF
    monkeypatch.setattr(loading, "load_model", lambda name, **kw: model if kw.get("remote") else None)
    return model, fail_after


def test_remote_search_prints_its_cost_and_resumes_after_a_failed_request(dry_run_remote, tmp_path, capsys):
    model, fail_after = dry_run_remote
    argv = [*SEARCH, "--backend", "nnsight", "--remote", "--configs-per-pass", "4"]
    assert cli.main([*argv, "--out", str(tmp_path / "whole")]) == 0
    printed = capsys.readouterr().out
    cost_line = next(line for line in printed.splitlines() if line.startswith("remote cost: "))
    # 28 configurations, at most 4 per pass within a wait (7, 6, 5, 4, 3, 2, 1 -> 2+2+2+1+1+1+1 = 10 passes),
    # for each of 2 batches of 16 prompts; 28 * 24 prompts * 7 tokens
    assert "28 configurations in 20 requests (4,704 prompt tokens)" in cost_line
    assert "remote usage of this run" in printed
    setup = int(re.search(r"plus (\d+) requests", cost_line).group(1))  # base check and the means' fit set
    fail_after[0] = setup + 3  # the setup passes, then 3 search requests, then a failure
    assert cli.main([*argv, "--out", str(tmp_path / "cut")]) == 2
    assert "the remote (NDIF) request failed: job failed on the server; finished results are saved" in \
           capsys.readouterr().err
    done = results(tmp_path / "cut")
    assert 0 < len(done) < 28
    fail_after[0] = None
    assert cli.main([*argv, "--out", str(tmp_path / "cut")]) == 0
    assert f"resumed {len(done)} configuration(s)" in capsys.readouterr().out
    assert results(tmp_path / "cut") == results(tmp_path / "whole")


def test_lens_refuses_remote(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "zoo_names", lambda: [])  # as for a model NDIF hosts
    monkeypatch.setenv("NDIF_API_KEY", "test-key")
    argv = ["lens", "--model", "m", "--task", "add_sub", "--backend", "nnsight", "--remote", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith("af1 lens: error: af1 lens decodes residual states here and needs the "
                                              "model's weights: run it without --remote")


def test_prune_by_attribution_refuses_remote(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "zoo_names", lambda: [])  # as for a model NDIF hosts
    monkeypatch.setenv("NDIF_API_KEY", "test-key")
    argv = ["prune", "--model", "m", "--task", "add_sub", "--wait", "0", "--transfer", "1", "--backend", "nnsight",
            "--remote", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "--rank attribution takes gradients through the model here" in capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--batch-size", "auto"], "--batch-size auto sizes batches for this machine's devices: give a number with --remote"),
    (["--device-map", "auto"], "--device-map places weights here; a remote model's weights stay on NDIF: drop it"),
])
def test_remote_refuses_local_placement(extra, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "zoo_names", lambda: [])  # as for a model NDIF hosts
    monkeypatch.setenv("NDIF_API_KEY", "test-key")
    argv = ["search", "--model", "m", "--task", "add_sub", "--backend", "nnsight", "--remote", *extra,
            "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"af1 search: error: {message}")


def test_edges_on_nnsight_equal_the_bridge(tmp_path):
    """``af1 edges`` through nnsight's split-input emulation on the grouped-query ground truth: the same prompts,
    the same edge table and scores (to float32 rounding) and the same circuit curve as the bridge."""
    import numpy as np

    from circuits import results as stored

    argv = ["edges", "--model", "arith-llama-gt-w1t2", "--task", "add_sub", "--n-prompts", "12", "--method",
            "eap-ig", "--steps", "3", "--counterfactual", "corrupted", "--no-progress"]
    assert cli.main([*argv, "--backend", "bridge", "--out", str(tmp_path / "b")]) == 0
    assert cli.main([*argv, "--backend", "nnsight", "--out", str(tmp_path / "n")]) == 0
    b, n = stored.load(tmp_path / "b").to_pandas(), stored.load(tmp_path / "n").to_pandas()
    assert len(b) == len(n) > 1000
    assert (b[["src", "src_pos", "dst", "dst_pos", "input"]] == n[["src", "src_pos", "dst", "dst_pos", "input"]]).all().all()
    scale = float(np.abs(b["score"]).max())
    assert scale > 0 and np.abs(b["score"].to_numpy() - n["score"].to_numpy()).max() <= 1e-4 * scale
    cb, cn = stored.load(tmp_path / "b").curve, stored.load(tmp_path / "n").curve
    assert [p.faithfulness for p in cn.points] == pytest.approx([p.faithfulness for p in cb.points], abs=1e-4)
