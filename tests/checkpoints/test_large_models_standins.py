"""What large models need, tried on stand-ins on CPU: ``device_map`` / ``max_memory`` (accelerate dispatch on
the bridge, ``n_devices`` on hooked), the memory estimate printed before loading, and ``--batch-size auto``
halving the batch after a (simulated) out-of-memory error without losing finished configurations."""

from __future__ import annotations

import json

import pytest
import torch

from circuits import cli
from circuits.models import loading, memory
from tests import standins
from tests.checkpoints.test_commands_standins import read_jsonl
from tests.conftest import BACKENDS, needs_hooked

TEXT = "12+34="


@pytest.mark.parametrize("key", ["gpt2", "llama3"])
@pytest.mark.parametrize("device_map,max_memory",
                         [("cpu", None), ("sequential", "cpu=1GiB"), ("auto", {"cpu": "1GiB"})])
def test_bridge_device_map_on_cpu(key, device_map, max_memory, load_standin, standin_hub):
    """Dispatched by accelerate onto the CPU: the same logits as a plain load."""
    ref = load_standin(key, "bridge")
    model = loading.load_model(standins.STANDINS[key].repo, backend="bridge", device_map=device_map,
                               max_memory=max_memory)
    toks = ref.to_tokens(TEXT)
    with torch.inference_mode():
        torch.testing.assert_close(model(toks), ref(toks), atol=0, rtol=0)
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_max_memory_reaches_the_dispatcher(standin_hub):
    """A budget too small for the weights makes accelerate offload to disk, which TransformerLens refuses:
    the budget was passed on; the error says what to do."""
    with pytest.raises(ValueError, match=r"^cannot load model 'gpt2': .*offload.*; with a device map the model "
                                         r"must fit on the GPUs \(or all on the CPU\) within max_memory"):
        loading.load_model("gpt2", backend="bridge", device_map="sequential", max_memory="cpu=100KB")
    with pytest.raises(ValueError, match=r"^max_memory \(--max-memory\) needs device_map"):
        loading.load_model("gpt2", backend="bridge", max_memory="cpu=1GiB")


@needs_hooked
def test_hooked_device_map_becomes_n_devices(monkeypatch, load_standin, standin_hub):
    from transformer_lens import HookedTransformer

    seen = []
    original = HookedTransformer.from_pretrained

    def spy(name, **kwargs):
        seen.append(kwargs)
        return original(name, **kwargs)

    monkeypatch.setattr(HookedTransformer, "from_pretrained", spy)
    model = loading.load_model("gpt2", backend="hooked", device_map="sequential", max_memory="cpu=1GiB")
    assert seen[-1]["n_devices"] == 1 and seen[-1]["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    ref = load_standin("gpt2", "hooked")
    toks = ref.to_tokens(TEXT)
    with torch.inference_mode():
        torch.testing.assert_close(model(toks), ref(toks), atol=0, rtol=0)


def test_estimate_before_loading(standin_hub):
    """The estimate reads the config and tokenizer only: parameters of the stand-in (counted on a model
    loaded with transformers), the longest tokenised prompt plus BOS."""
    import transformers as tf

    snapshot = standin_hub / "models--meta-llama--Meta-Llama-3-8B" / "snapshots" / standins.REVISION
    hf = tf.AutoModelForCausalLM.from_pretrained(snapshot)
    tok = tf.AutoTokenizer.from_pretrained(snapshot)
    from circuits.tasks import catalogue as tasks

    est = memory.estimate_pretrained("meta-llama/Meta-Llama-3-8B", "bfloat16", "add", 8, 4)
    n_params = sum(p.numel() for p in hf.parameters())
    n_pos = 1 + max(len(tok.encode(r["prompt"], add_special_tokens=False)) for r in tasks.build_task("add", n=8))
    assert est.n_params == n_params and est.weights == 2 * n_params
    assert est.means == 4 * 2 * (8 * n_pos * 64 + n_pos * 64 + n_pos * 4 * 16)
    assert memory.estimate_pretrained("no-such/model", None, "add", 8, 4) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_halves_the_batch_after_out_of_memory(backend, self_answering, monkeypatch, tmp_path, capsys):
    """``--batch-size auto`` (on CPU: 64, at most the 12 prompts) with a model that runs out of memory for
    more than 4 prompts' worth of tokens (4 x 5 positions) per pass once two configurations are written:
    the command halves the batch (12 -> 6 -> 3), resumes, and writes every configuration once, with the
    counts of a run at batch 3. (Memory counts tokens: the fast search's last-position tail packs the rows
    of several batches into one pass of about one batch's tokens.)"""
    out = tmp_path / "auto"
    load = loading.load_model

    def fragile(*args, **kwargs):
        model = load(*args, **kwargs)

        def hook(module, args, kwargs):
            x = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
            done = (out / "results.jsonl").exists() and len(read_jsonl(out / "results.jsonl")) >= 2
            if x.shape[0] * x.shape[1] > 4 * 5 and done:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        model.blocks[-1].register_forward_pre_hook(hook, with_kwargs=True)
        return model

    monkeypatch.setattr(loading, "load_model", fragile)
    common = ["search", "--model", "gpt2", "--task", "add", "--n-prompts", "12", "--backend", backend,
              "--prepend-bos", "--no-progress", "--grid", "full"]
    assert cli.main([*common, "--out", str(out), "--batch-size", "auto"]) == 0
    said = capsys.readouterr().out
    assert "--batch-size auto: 12 prompts per forward pass on cpu" in said
    assert said.count("out of device memory: retrying with --batch-size") == 2
    assert "retrying with --batch-size 3 (finished results are kept)" in said
    monkeypatch.setattr(loading, "load_model", load)
    assert cli.main([*common, "--out", str(tmp_path / "ref"), "--batch-size", "3"]) == 0
    rows, ref = read_jsonl(out / "results.jsonl"), read_jsonl(tmp_path / "ref" / "results.jsonl")
    key = lambda r: (r["wait"], r["transfer"])  # noqa: E731
    assert len({key(r) for r in rows}) == len(rows) == len(ref) == 6  # every configuration once
    assert {key(r): r["n_faithful"] for r in rows} == {key(r): r["n_faithful"] for r in ref}
    assert json.loads((out / "summary.json").read_text())["n_prompts"] == 12


def test_commands_take_a_device_map_and_print_the_estimate(self_answering, tmp_path, capsys):
    """``af1 necessity --device-map sequential --max-memory cpu=1GiB`` writes what the plain command writes,
    after printing the estimate of :func:`circuits.models.memory.estimate_pretrained` for its arguments."""
    common = ["necessity", "--model", "Qwen/Qwen2.5-0.5B", "--task", "add", "--n-prompts", "8", "--backend",
              "bridge", "--prepend-bos", "--no-progress", "--batch-size", "4"]
    assert cli.main([*common, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert cli.main([*common, "--out", str(tmp_path / "mapped"), "--device-map", "sequential",
                     "--max-memory", "cpu=1GiB"]) == 0
    said = capsys.readouterr().out  # logged information: on stdout
    est = memory.estimate_pretrained("Qwen/Qwen2.5-0.5B", None, "add", 8, 4)
    assert said.splitlines()[0] == f"Qwen/Qwen2.5-0.5B: {est.describe()}"
    blocks = [json.loads((tmp_path / d / "necessity.json").read_text())["blocks"] for d in ("plain", "mapped")]
    assert blocks[0] == blocks[1] and len(blocks[0]) == standins.N_LAYERS
    command = json.loads((tmp_path / "mapped" / "necessity.json").read_text())["command"]
    assert command[command.index("--device-map") + 1] == "sequential"


def test_sweep_takes_a_device_map(self_answering, tmp_path, capsys):
    """``af1 sweep`` with ``--device-map``/``--max-memory``: the cell's faithfulness is the one the plain
    sweep finds; the estimate is printed before the model loads; the map is not part of the identity."""
    common = ["sweep", "--models", "gpt2", "--tasks", "add", "--wait", "0", "--transfer", "1", "--n-prompts", "8",
              "--backend", "bridge", "--no-progress", "--batch-size", "4"]
    assert cli.main([*common, "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert cli.main([*common, "--out", str(tmp_path / "mapped"), "--device-map", "sequential",
                     "--max-memory", "cpu=1GiB"]) == 0
    est = memory.estimate_pretrained("gpt2", None, "add", 8, 4)
    assert f"gpt2: {est.describe()}" in capsys.readouterr().out
    tables = [(tmp_path / d / "table.csv").read_text() for d in ("plain", "mapped")]
    assert tables[0] == tables[1] and "gpt2" in tables[0]
