"""Every command line (``af1 search``, ``necessity``, ``prune``, ``lens``) on stand-in checkpoints of real
architectures, in process (``circuits.cli.main``), on both backends and in float32 and bfloat16.

Random models answer nothing, so the ``self_answering`` fixture (tests only) replaces
``circuits.prompts.sampling.prepare_prompts`` for the duration of a test: the commands then run on prompts whose
"answers" are the model's own top-1 tokens. What the commands write is checked against the Python API
run independently on the same prompts: the naive search (one full forward pass per configuration), the
necessity sweep, the faithfulness of the pruned subgraph before pruning, and a plain forward pass for the
lens's last sub-layer.
"""

from __future__ import annotations

import json

import pytest
import torch

import interventions as iv
from circuits import cli
from circuits.faithfulness import faithfulness
from circuits.necessity import necessity_sweep
from circuits.search import search_af1
from tests import standins
from tests.checkpoints.conftest import self_answered_prompts
from tests.conftest import BACKENDS

N = 8
KEYS = ("gpt2", "pythia", "gptj", "qwen2", "yi", "llama3", "gemma")


def cases():
    """``(key, backend, dtype)``: every stand-in TransformerLens loads on a backend, float32 and bfloat16."""
    out = []
    for key in KEYS:
        for backend in BACKENDS:
            if backend == "hooked" and not standins.STANDINS[key].hooked:
                continue  # 3.9 builds Llama/Gemma names from built-in configs (test_loading_standins)
            for dtype in (None, "bfloat16"):
                out.append(pytest.param(key, backend, dtype, id=f"{key}-{backend}-{dtype or 'float32'}"))
    return out


def af1(command: str, key: str, backend: str, dtype: str | None, out, *extra: str) -> int:
    argv = [command, "--model", standins.STANDINS[key].repo, "--task", "add", "--n-prompts", str(N),
            "--out", str(out), "--backend", backend, "--batch-size", "4", "--prepend-bos", *extra]
    if command != "lens":
        argv.append("--no-progress")
    return cli.main(argv + (["--dtype", dtype] if dtype else []))


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("key,backend,dtype", cases())
def test_commands_on_standins(key, backend, dtype, self_answering, load_standin, tmp_path, capsys):
    model = load_standin(key, backend, dtype)
    p = self_answered_prompts(model, "add", N, prepend_bos=True)

    def run(command: str, *extra: str) -> int:
        return af1(command, key, backend, dtype, tmp_path / command, *extra)

    if key == "gptj" and backend == "bridge":
        # The bridge runs GPT-J's Hugging Face attention, which ignores pattern edits: one line, exit 2.
        assert run("search") == 2
        lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("af1 ")]
        assert len(lines) == 1
        assert lines[0].startswith("af1 search: error: this TransformerBridge wrapping GPTJForCausalLM ignores edits")
        return
    tol = 0 if dtype is None else 1  # bfloat16: the fast shortcuts round differently (one prompt at most)

    assert run("search") == 0
    rows = read_jsonl(tmp_path / "search" / "results.jsonl")
    naive = {tuple(c.config): c.n_faithful
             for c in search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="naive", progress=False,
                                 n_boot=10, batch_size=4).results}
    assert rows and all(r["n"] == N for r in rows)
    assert max(abs(r["n_faithful"] - naive[r["wait"], r["transfer"]]) for r in rows) <= tol
    identity = json.loads((tmp_path / "search" / "run.json").read_text())
    assert identity["model"] == standins.STANDINS[key].repo

    assert run("necessity") == 0
    blocks = json.loads((tmp_path / "necessity" / "necessity.json").read_text())["blocks"]
    api = necessity_sweep(model, p.tokens, p.answers, progress=False, n_boot=10, batch_size=4)
    assert [b["layer"] for b in blocks] == list(range(model.cfg.n_layers))
    assert [b["n_faithful"] for b in blocks] == [b.n_faithful for b in api.blocks]

    assert run("prune", "--wait", "0", "--transfer", "1", "--confirm-top", "2") == 0
    summary = json.loads((tmp_path / "prune" / "summary.json").read_text())
    means = iv.MeanCache.fit(model, p.fit.tokens, batch_size=4, progress=False)
    unpruned = faithfulness(model, p.tokens, p.answers, iv.af1_subgraph(model.cfg.n_layers, 0, 1, means),
                            batch_size=4, n_boot=10)
    assert summary["n_prompts"] == N and summary["n_transfer_heads"] == model.cfg.n_heads
    assert abs(summary["unpruned_faithfulness"] - unpruned.faithfulness) * N <= tol

    assert run("lens") == 0
    lens = json.loads((tmp_path / "lens" / "lens.json").read_text())
    with torch.inference_mode():
        probs = model(p.tokens)[:, -1].float().softmax(-1).gather(-1, p.answers[:, None]).squeeze(-1)
    assert lens["answer_tokens"] == p.answers.tolist()
    assert lens["rows"][-1]["answer_prob"] == pytest.approx(float(probs.mean()), abs=1e-4)
    assert lens["rows"][-1]["answer_rank"] == 0.0
