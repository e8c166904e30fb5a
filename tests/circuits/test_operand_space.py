"""Operand spaces too large to enumerate (three operands in 0..999: 10^9 tuples) are drawn from, never listed.

Checked against independent computations: the size estimate against an exact count by convolution, the
stream against the task's own answer rule and a uniform sample's expected operand mean, the fit set against
counting its entries by hand, and the fit cost against the published Llama-3-8B shape by hand.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from circuits.errors import ArgumentError
from circuits.models import memory
from circuits.tasks import catalogue as tasks
from circuits.tasks import operand_space

BIG = "examples/add_sub_3digit.toml"


def exact_add_sub_count(hi: int = 999) -> int:
    """Tuples (a, b, c) in 0..hi with 0 <= a + b - c <= hi, by convolution: s = a + b has count(s) ways, and
    c then ranges over max(0, s - hi) .. min(hi, s)."""
    ones = np.ones(hi + 1, dtype=np.int64)
    ways = np.convolve(ones, ones)  # ways[s] for s in 0..2 hi
    s = np.arange(len(ways))
    n_c = np.minimum(hi, s) - np.maximum(0, s - hi) + 1
    return int((ways * n_c).sum())


def test_the_size_of_a_large_space_is_estimated_within_a_percent():
    got = tasks.operand_space_count(BIG)
    exact = exact_add_sub_count()
    assert exact == 666_667_000
    small = sum(0 <= a + b - c <= 20 for a in range(21) for b in range(21) for c in range(21))
    assert exact_add_sub_count(20) == small  # the formula, against brute force on 0..20
    assert not got.exact and abs(got.n - exact) / exact < 0.005, (got, exact)
    assert got.describe().startswith("about 6.6")
    assert tasks.operand_space_size(BIG) == got.n
    listed = tasks.operand_space_count("add_sub")  # enumerated, exact
    assert listed.exact and listed.n == len(tasks.task_operands(tasks.get_task("add_sub")))


def test_prompts_are_drawn_without_enumeration(monkeypatch):
    """A seeded stream of valid, distinct tuples: deterministic in the seed, windows of one seed never repeat,
    exclusions honoured, answers the task's rule; the enumeration is never called."""
    def refuse(*a, **k):
        raise AssertionError("the 10^9-tuple space was enumerated")

    monkeypatch.setattr(operand_space, "enumerate_operands", refuse)
    ds = tasks.build_task(BIG, 400, seed=3)
    ops = np.array(ds["operands"])
    assert ops.shape == (400, 3) and len({tuple(r) for r in ops.tolist()}) == 400
    assert list(ds["answer"]) == [a + b - c for a, b, c in ops.tolist()]
    assert all(0 <= x <= 999 for x in ds["answer"]) and ops.min() >= 0 and ops.max() <= 999
    assert ds["prompt"][0] == f"{ops[0, 0]}+{ops[0, 1]}-{ops[0, 2]}="
    assert tasks.build_task(BIG, 150, seed=3, start=250)["operands"] == ds["operands"][250:]
    assert tasks.build_task(BIG, 400, seed=4)["operands"] != ds["operands"]
    excluded = {tuple(r) for r in ops[:10].tolist()}
    rest = tasks.build_task(BIG, 390, seed=3, exclude=excluded)["operands"]
    assert rest == ds["operands"][10:]
    monkeypatch.undo()
    with pytest.raises(ArgumentError, match="1000000000 tuples, more than 5000000 to list one by one: draw"):
        tasks.task_operands(tasks.get_task(BIG))


def test_the_stream_is_uniform_over_the_valid_tuples():
    """E[c | 0 <= a + b - c <= 999] computed exactly by convolution against the mean over 20000 draws
    (standard error about 2)."""
    hi = 999
    ones = np.ones(hi + 1)
    ways = np.convolve(ones, ones)
    total = mean_c = 0.0
    for s, w in enumerate(ways):
        c_lo, c_hi = max(0, s - hi), min(hi, s)
        n = c_hi - c_lo + 1
        total += w * n
        mean_c += w * n * (c_lo + c_hi) / 2
    expected = mean_c / total
    ops = np.array(tasks.build_task(BIG, 20_000, seed=0)["operands"])
    assert abs(ops[:, 2].mean() - expected) < 10, (ops[:, 2].mean(), expected)


def test_a_fit_set_is_drawn_from_a_large_space(tmp_path, monkeypatch):
    """On the zoo tokenizer (single tokens up to 520), a task of three operands in 0..999: the fit set is drawn
    (never enumerated), disjoint from the scored prompts, of their layout, and every entry they read has
    ``min_count`` fit prompts (counted by hand)."""
    from circuits import zoo
    from circuits.prompts.fitset import FitSpec, draw_fit_set
    from interventions.coverage import row_digests

    if "arith-gpt2" not in zoo.available():
        pytest.skip("arith-gpt2 is not shipped")
    task = tmp_path / "big.toml"
    task.write_text('name = "big"\ntemplate = "{A}+{B}-{C}="\nanswer = "A+B-C"\nanswer_min = 0\nanswer_max = 520\n'
                    '[slots]\nA = { range = [0, 999] }\nB = { range = [0, 999] }\nC = { range = [0, 999] }\n')
    model = zoo.load("arith-gpt2")
    rows = [r for r in tasks.build_task(str(task), 400, seed=9)["operands"] if max(r) <= 520][:30]
    scored = model.to_tokens([f"{a}+{b}-{c}=" for a, b, c in rows])
    assert scored.shape == (30, 7)

    def refuse(*a, **k):
        raise AssertionError("the 10^9-tuple space was enumerated")

    monkeypatch.setattr(operand_space, "enumerate_operands", refuse)
    fit = draw_fit_set(model, str(task), scored, FitSpec(size=300, min_count=3, seed=1))
    assert not fit.whole and len(fit) >= 300 and fit.tokens.shape[1] == 7
    assert not bool(torch.isin(row_digests(fit.tokens), row_digests(scored)).any())
    counts = Counter((t, tok) for row in fit.tokens.tolist() for t, tok in enumerate(row) if t >= 1)
    needed = {(t, tok) for row in scored.tolist() for t, tok in enumerate(row) if t >= 1}
    assert min(counts[e] for e in needed) >= 3


def test_the_fit_cost_of_llama3_8b_on_three_digit_operands(monkeypatch):
    """The line printed before loading (circuits.models.memory.fit_cost): 10,000 fit prompts of 7 tokens (BOS and 6:
    Llama-3 writes 0..999 as one token each), 79 passes of 128, 2 x 8,030,261,248 FLOP per token."""
    import transformers as tf

    config = tf.LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                            intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
    est = memory.estimate_memory(memory.shape_of_hf_config(config), "bfloat16", n_pos=7, n_prompts=200,
                                 batch_size=128)
    line = memory.fit_cost(BIG, 10_000, 128, est)
    flop = 2 * 8_030_261_248 * 10_000 * 7
    assert line == (f"means: fit set of up to 10000 prompts (a sample of "
                    f"{tasks.operand_space_count(BIG).describe()} task prompts), 79 forward passes of 128, "
                    f"{flop / 1e12:.1f} TFLOP: about {flop / memory.GPU_FLOPS:.1f} s on a GPU at 200 TFLOP/s")
    assert "1124.2 TFLOP: about 5.6 s" in line
    # on CPU: a CPU estimate at the rate measured on this machine, never a GPU's
    monkeypatch.setattr(memory, "_CPU_RATE", [5e10])
    cpu = memory.fit_cost(BIG, 10_000, 128, est, device="cpu")
    assert "GPU" not in cpu and f"about {flop / 5e10 / 3600:.1f} h on this CPU (50 GFLOP/s measured now" in cpu
    small = memory.estimate_memory(memory.shape_of_hf_config(tf.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=1000)),
        "float32", n_pos=7, n_prompts=200, batch_size=128)
    tiny = memory.fit_cost(BIG, 10_000, 128, small, device="cpu")
    small_flop = 2.0 * small.n_params * 10_000 * 7
    assert f"{small_flop / 1e9:.1f} GFLOP: about {small_flop / 5e10:.1f} s on this CPU" in tiny
    assert "about 0.0 s" not in memory.fit_cost(BIG, 10, 128, small)
    monkeypatch.setattr(memory, "_CPU_RATE", [])
    assert 1e8 < memory.cpu_flops() < 1e14 and memory.cpu_flops() == memory._CPU_RATE[0]  # measured once


def test_consecutive_windows_draw_the_stream_once(monkeypatch):
    """The prompt sampler and the fit set ask for windows ``start .. start + n - 1`` one after another: the
    stream is kept between them, so four windows of a chunk each draw six chunks of tuples (two in three are
    valid; each window drawing its whole prefix again drew about sixteen), and the windows are the slices of one
    long draw."""
    spec = tasks.get_task(BIG)
    n = operand_space.CHUNK
    whole = operand_space.ordered_operands(spec, 4 * n, seed=11)
    operand_space._streams.clear()
    calls = []
    valid = operand_space._valid
    monkeypatch.setattr(operand_space, "_valid", lambda s, ops: calls.append(len(ops)) or valid(s, ops))
    windows = [operand_space.ordered_operands(spec, n, seed=11, start=k * n) for k in range(4)]
    assert all(np.array_equal(w, whole[k * n:(k + 1) * n]) for k, w in enumerate(windows))
    assert len(calls) <= 7, len(calls)
