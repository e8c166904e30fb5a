"""``benchmarks/gpu.py --small`` end to end on the CPU, in a subprocess as the GPU run starts it: every phase
runs and the JSON file holds every figure with sane values; in float32 the naive sample's correctness counts
equal the fast search's, in bfloat16 they agree up to rounding. Also: a phase past its budget is recorded and
the file stays complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PHASES = ["imports", "build", "estimate", "load", "prompts", "batch", "means", "search", "interventions", "naive"]
SUMMARY = ["build_s", "load_s", "load_peak_bytes", "configurations", "batch_size", "fast_s", "fast_passes",
           "naive_sample_s", "naive_configs", "naive_full_grid_estimate_s", "naive_full_grid_passes_estimate",
           "naive_over_fast", "counts_identical", "agreement", "max_relative_logit_diff", "af1_over_plain_forward",
           "search_peak_bytes", "search_estimate_bytes", "search_peak_over_estimate", "weights_bytes",
           "weights_estimate_bytes", "weights_over_estimate"]
N_CONFIGS = 15  # 4 blocks: waits -1..3 with 5, 4, 3, 2, 1 transfers


def small_parameters() -> int:
    """The small Llama by hand: embedding and unembedding (1000 x 64), per block q/o (64 x 64), k/v (64 x 2 heads
    of 16), gate/up/down (3 x 64 x 128) and two norm scales, plus the final norm."""
    d, vocab, mlp, kv = 64, 1000, 128, 2 * 16
    return 2 * vocab * d + 4 * (2 * d * d + 2 * d * kv + 3 * d * mlp + 2 * d) + d


def test_llama3_8b_config_and_the_estimate_printed_before_loading(tmp_path):
    """The GPU run's configuration is a valid ``LlamaConfig`` of Meta-Llama-3-8B's size, and the estimate read
    from its folder (the config alone) is the README's: weights 14.96 GiB for 8.03B parameters in bfloat16."""
    import benchmarks.gpu as gpu

    gpu.llama_config(gpu.LLAMA3_8B).save_pretrained(tmp_path)
    estimate = gpu.estimate_from_folder(tmp_path, "bfloat16", len(gpu.LAYOUT), 200, 200)
    assert estimate.n_params == 8_030_261_248 and estimate.weights == 2 * estimate.n_params
    assert estimate.describe().startswith("memory estimate: weights 14.96 GiB (8.03B parameters, bfloat16) + ")


def run_script(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``benchmarks/gpu.py --small --device cpu --out OUT ARGS`` from another folder, offline; its JSON record."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--small", "--device", "cpu",
                           "--out", str(out), *args], cwd=out.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    return run_script(tmp_path_factory.mktemp("gpu") / "gpu.json", "--dtype", "float32")


def test_every_phase_runs_and_records_its_figures(float32_run):
    proc, data = float32_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert list(data["phases"]) == PHASES
    for name, rec in data["phases"].items():
        assert rec["status"] == "ok" and 0 <= rec["seconds"] <= rec["budget_s"], (name, rec)
        assert rec["peak_bytes"] is None and rec["allocated_bytes"] is None  # the CPU has no such counters
    env = data["environment"]
    assert env["device"] == "cpu" and all(env["versions"][d] for d in ("torch", "transformers", "transformer-lens"))
    assert list(data["summary"]) == SUMMARY and data["total_s"] > 0
    assert "--batch-size auto: 64 prompts per forward pass on cpu" in proc.stdout
    assert "memory estimate: weights " in proc.stdout


def test_checkpoint_estimate_and_load(float32_run):
    _, data = float32_run
    p = data["phases"]
    build, estimate, load = p["build"], p["estimate"]["estimate"], p["load"]
    assert build["n_params"] == small_parameters() == estimate["n_params"] == 276_032
    assert build["bytes_on_disk"] > 4 * build["n_params"] and not Path(build["folder"]).exists()  # removed after
    assert estimate["weights"] == 4 * build["n_params"] and estimate["batch_size"] == 64
    assert estimate["total"] == estimate["weights"] + estimate["means"] + estimate["activations"]
    assert estimate["line"].startswith("memory estimate: weights ")
    assert load["model_class"] == "TransformerBridge" and load["backend"] == "bridge"
    # TransformerLens 3.9's compatibility mode adds an unembedding bias (1000 floats): within 1%.
    assert 1.0 <= data["summary"]["weights_over_estimate"] < 1.01


def test_prompts_batch_means_and_search(float32_run):
    _, data = float32_run
    p = data["phases"]
    assert p["prompts"]["n_prompts"] == 200 and p["prompts"]["n_pos"] == 7 and p["prompts"]["distinct_answers"] >= 1
    assert p["batch"]["requested"] == "auto" and p["batch"]["batch_size"] == 64 and p["batch"]["free_bytes"] is None
    assert 4 < p["means"]["n_entries"] <= 4 + 3 * 100  # BOS and three operators, three operands of 100 values
    search = p["search"]
    assert search["configurations"] == N_CONFIGS and search["passes"] > N_CONFIGS and search["tail"] == "pair"
    assert search["n_prompts"] == 200 and search["base_accuracy"] == 1.0 and search["batch_sizes_tried"] == [64]
    assert 0 < search["search_s"] <= search["call_s"] <= search["seconds"]
    assert search["estimate"]["batch_size"] == 64 and search["estimate"]["total"] > search["estimate"]["weights"]


def test_interventions_and_naive_sample(float32_run):
    _, data = float32_run
    p, s = data["phases"], data["summary"]
    forwards = p["interventions"]
    assert forwards["rounds"] >= 1 and forwards["plain_s"] > 0 and forwards["af1_s"] > 0
    assert forwards["ratio"] == pytest.approx(forwards["af1_s"] / forwards["plain_s"])
    naive = p["naive"]
    assert naive["compared"] == naive["requested"] == naive["grid"] == N_CONFIGS and naive["scale"] == 1.0
    assert naive["counts_identical"] and naive["agreement"] == "identical" and naive["differences"] == []
    for config, rec in naive["configs"].items():
        assert rec["fast"] == rec["naive"] and rec["prompts_judged_differently"] == 0, config
        assert rec["max_logit_diff"] <= 1e-5 * rec["logit_scale"], config
    assert naive["full_grid_estimate_s"] == pytest.approx(naive["naive_s"]) and naive["naive_s"] > 0
    assert naive["passes"] == naive["full_grid_passes_estimate"] == N_CONFIGS * 4  # 200 prompts, batch 64
    assert s["counts_identical"] and s["naive_over_fast"] == pytest.approx(naive["naive_s"] / s["fast_s"])
    assert s["af1_over_plain_forward"] > 0 and s["fast_s"] > 0 and s["search_peak_over_estimate"] is None


def test_bfloat16_agrees_up_to_rounding(tmp_path):
    """The GPU run's dtype: a sample of 5 configurations on 64 prompts; counts equal, or differ only where the
    logits are within the rounding bound of each other."""
    from benchmarks.gpu import ROUNDING

    proc, data = run_script(tmp_path / "gpu.json", "--naive-configs", "5", "--prompts", "64", "--repeats", "1")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    naive, estimate = data["phases"]["naive"], data["phases"]["estimate"]["estimate"]
    assert estimate["dtype"] == "bfloat16" and estimate["weights"] == 2 * small_parameters()
    assert naive["compared"] == 5 and naive["scale"] == N_CONFIGS / 5
    assert naive["agreement"] in ("identical", "rounding") and naive["max_relative_logit_diff"] <= ROUNDING
    assert naive["counts_identical"] == (naive["differences"] == [])


def test_a_phase_past_its_budget_is_recorded(tmp_path, monkeypatch):
    import benchmarks.gpu as gpu

    monkeypatch.setitem(gpu.PHASE_BUDGETS, "build", 0.2)
    monkeypatch.setattr(gpu, "CPU_SLACK", 1)
    report = gpu.Report(tmp_path / "gpu.json", gpu.resolved_device("cpu"), 60)
    with pytest.raises(gpu.PhaseFailed):
        report.phase("build", lambda budget: time.sleep(5))
    rec = json.loads((tmp_path / "gpu.json").read_text())["phases"]["build"]
    assert rec["status"] == "out of time" and rec["error"] == "OutOfTime: over its budget of 0.2 s"
    assert 0.2 <= rec["seconds"] < 2 and rec["budget_s"] == 0.2
    assert report.phase("estimate", lambda budget: ({"budget": budget}, "value")) == "value"  # the next one runs


def test_a_failed_search_still_times_the_forward_passes(tmp_path, monkeypatch):
    import benchmarks.gpu as gpu

    def broken(*args, **kwargs):
        raise RuntimeError("no search today")

    monkeypatch.setattr(gpu, "search_with_estimate", broken)
    out = tmp_path / "gpu.json"
    rc = gpu.main(["--small", "--device", "cpu", "--dtype", "float32", "--prompts", "16", "--repeats", "1",
                   "--out", str(out)])
    data = json.loads(out.read_text())
    assert rc == 1 and list(data["phases"]) == PHASES[:-1]  # no naive sample without the search to compare
    search = data["phases"]["search"]
    assert search["status"] == "failed" and search["error"] == "RuntimeError: no search today"
    assert "no search today" in search["traceback"]
    assert data["phases"]["interventions"]["status"] == "ok" and data["summary"]["af1_over_plain_forward"] > 0
    assert data["summary"]["fast_s"] is None and data["summary"]["agreement"] is None
