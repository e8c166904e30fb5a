"""Memory estimates (against hand computations from published model sizes), ``--batch-size auto`` and the
halving of the batch on a device out-of-memory error, and the parsing of ``--device-map`` / ``--max-memory``."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import ArgumentError
from circuits.models import memory, placement

GIB = 2**30


def llama3_8b_config():
    import transformers as tf

    return tf.LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)


def llama3_parameters(d: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int) -> int:
    """By hand: embedding and unembedding, per block q/o (d x d), k/v (d x kv_heads * d_head), gate/up/down
    (3 x d x mlp) and two RMSNorm scales, plus the final norm."""
    d_head = d // heads
    block = 2 * d * d + 2 * d * kv_heads * d_head + 3 * d * mlp + 2 * d
    return 2 * vocab * d + layers * block + d


def test_parameter_count_from_the_config_matches_the_hand_count():
    import transformers as tf

    shape = memory.shape_of_hf_config(llama3_8b_config())
    assert shape.n_params == llama3_parameters(4096, 32, 32, 8, 14336, 128256) == 8_030_261_248
    assert (shape.n_layers, shape.d_model, shape.n_heads, shape.d_head, shape.d_mlp, shape.d_vocab) == (
        32, 4096, 32, 128, 14336, 128256)
    # GPT-2 small: tied embeddings count once (the published 124,439,808).
    gpt2 = memory.shape_of_hf_config(tf.GPT2Config())
    d, v, n_ctx = 768, 50257, 1024
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    assert gpt2.n_params == v * d + n_ctx * d + 12 * block + 2 * d == 124_439_808
    assert (gpt2.d_mlp, gpt2.d_head) == (4 * d, 64)


def test_estimate_of_llama3_8b_in_bfloat16():
    """README: the means of A+B-C= with operands 0..999 on Llama-3-8B (3004 entries, 7 positions)."""
    shape = memory.shape_of_hf_config(llama3_8b_config())
    est = memory.estimate_memory(shape, "bfloat16", n_pos=7, n_prompts=200, batch_size=32, n_entries=3004)
    assert est.weights == 2 * 8_030_261_248
    assert est.means == 4 * 32 * (3004 * 4096 + 7 * 4096 + 7 * 32 * 128) == 1_582_301_184
    per_block = 6 * 4096 + 2 * 14336 + 2 * 32 * 7
    assert est.per_prompt == 2 * 7 * 32 * per_block + (2 + 4) * 7 * 128256
    assert est.activations == 32 * est.per_prompt and est.total == est.weights + est.means + est.activations
    assert est.describe().startswith("memory estimate: weights 14.96 GiB (8.03B parameters, bfloat16) + CAMA "
                                     "means 1.47 GiB + activations ")
    # Without n_entries: the upper bound, every prompt's positions distinct (200 x 7).
    bound = memory.estimate_memory(shape, None, n_pos=7, n_prompts=200, batch_size=1)
    assert bound.means == memory.means_cache_bytes(shape, 1400, 7) and bound.weights == 4 * 8_030_261_248


def test_auto_batch_size():
    shape = memory.ModelShape(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=256, d_vocab=700, n_params=1)
    per = memory.activation_bytes_per_prompt(shape, 6)
    assert per == 4 * 6 * 2 * (6 * 64 + 2 * 256 + 2 * 4 * 6) + 8 * 6 * 700
    cpu, gpus = [torch.device("cpu")], [torch.device("cuda:0"), torch.device("cuda:1")]
    assert memory.auto_batch_size(per, cpu, 500) == memory.AUTO_CPU_BATCH == 64
    assert memory.auto_batch_size(per, cpu, 10) == 10
    free = 10 * GIB
    assert memory.auto_batch_size(per, gpus[:1], 10**6, free=free) == memory.MAX_AUTO_BATCH
    big = 50 * 2**20  # 50 MiB per prompt, 1 GiB reserved for the means: floor((8 - 1) GiB / 50 MiB) = 143
    assert memory.auto_batch_size(big, gpus, 10**6, reserve=GIB, free=free) == int((0.8 * free - GIB) // big) == 143
    assert memory.auto_batch_size(big, gpus, 100, reserve=GIB, free=free) == 100
    assert memory.auto_batch_size(big, gpus, 10**6, reserve=20 * GIB, free=free) == 1
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(torch.float16))
    assert memory.model_devices(model) == cpu


class FakeRun:
    """Evaluates configurations one after another, ``per_batch`` prompts at a time; runs out of memory for
    batches above ``limit`` once ``fail_after`` configurations are done (memory fills up during a run).
    ``done`` plays the run's results file: finished configurations survive a failed attempt."""

    def __init__(self, n_configs: int, limit: int, fail_after: int):
        self.n_configs, self.limit, self.fail_after = n_configs, limit, fail_after
        self.done: list[tuple[int, int]] = []
        self.attempts: list[int] = []

    def __call__(self, batch_size: int) -> list[tuple[int, int]]:
        self.attempts.append(batch_size)
        for config in range(len(self.done), self.n_configs):  # resume: skip finished configurations
            if batch_size > self.limit and len(self.done) >= self.fail_after:
                raise torch.OutOfMemoryError(f"CUDA out of memory (batch {batch_size})")
            self.done.append((config, batch_size))
        return list(self.done)


def test_halve_on_oom_keeps_finished_results():
    run, said = FakeRun(n_configs=10, limit=8, fail_after=3), []
    result = memory.halve_on_oom(run, 64, log=said.append)
    assert run.attempts == [64, 32, 16, 8]
    assert result == [(c, 64) for c in range(3)] + [(c, 8) for c in range(3, 10)]
    assert said == [f"out of device memory: retrying with --batch-size {b} (finished results are kept)"
                    for b in (32, 16, 8)]


def test_halve_on_oom_gives_up():
    run = FakeRun(n_configs=4, limit=8, fail_after=0)
    with pytest.raises(torch.OutOfMemoryError):
        memory.halve_on_oom(run, 64, enabled=False)
    assert run.attempts == [64] and run.done == []
    never = FakeRun(n_configs=4, limit=0, fail_after=0)  # even batch 1 does not fit
    with pytest.raises(torch.OutOfMemoryError):
        memory.halve_on_oom(never, 4, log=lambda _: None)
    assert never.attempts == [4, 2, 1]
    with pytest.raises(ValueError, match="boom"):  # other errors are not retried
        memory.halve_on_oom(lambda b: (_ for _ in ()).throw(ValueError("boom")), 4)


def test_max_memory_and_device_map_parsing():
    assert placement.parse_max_memory("0=70GiB,1=70GiB,cpu=100GiB") == {0: "70GiB", 1: "70GiB", "cpu": "100GiB"}
    assert placement.parse_max_memory({"0": "2GB", "cpu": 1000}) == {0: "2GB", "cpu": "1000"}
    assert placement.parse_max_memory(None) is None
    for bad in ("0:70GiB", "gpu=1GiB", "0=lots", "", "0=70 parsecs"):
        with pytest.raises(ValueError, match=r"--max-memory .*(DEVICE=SIZE|is empty)"):
            placement.parse_max_memory(bad)
    assert placement.check_device_map("sequential") == "sequential" and placement.check_device_map("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"^--device-map 'everywhere' is not valid: use auto, balanced"):
        placement.check_device_map("everywhere")
    assert placement.hooked_n_devices(None, None) == 1 and placement.hooked_n_devices("cpu", None) == 1
    assert placement.hooked_n_devices("auto", {0: "1GiB", 1: "1GiB", "cpu": "9GiB"}) == 2


@pytest.mark.parametrize("argv,message", [
    (["--max-memory", "0=1GiB"], "--max-memory needs --device-map"),
    (["--device-map", "everywhere"], "--device-map 'everywhere' is not valid"),
    (["--device-map", "auto", "--max-memory", "0:1GiB"], "--max-memory entry 0:1GiB=''"),
    (["--batch-size", "0"], "--batch-size 0 is out of range"),
])
@pytest.mark.parametrize("command", ["search", "lens"])
def test_bad_placement_flags_are_one_line(command, argv, message, tmp_path, capsys):
    from circuits import cli

    out = tmp_path / "out"
    rc = cli.main([command, "--model", "gpt2", "--task", "add", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err and not out.exists()


def test_batch_size_must_be_a_number_or_auto(capsys):
    from circuits import cli

    with pytest.raises(SystemExit):
        cli.main(["search", "--model", "gpt2", "--task", "add", "--out", "x", "--batch-size", "many"])
    assert "'many' is not an integer or 'auto'" in capsys.readouterr().err
    assert isinstance(ArgumentError("x"), ValueError)
