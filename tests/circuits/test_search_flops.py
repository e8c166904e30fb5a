"""The fast search's FLOP count (the compute limit of ``benchmarks/bench_search.py``) against independent counts."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from circuits.search.cost import Dims, fast_flops, naive_flops
from tests.conftest import BACKENDS, build_model

TINY = Dims(n_layers=3, d_model=8, n_heads=2, n_kv_heads=1, d_head=4, d_mlp=16, d_vocab=11, gated=True)


def by_hand_block(tokens: int, keys: int) -> int:
    """One block of TINY written out matrix by matrix: q (8x8), k and v (8x4 each), o (8x8), scores and values
    (2 heads of 4 over ``keys`` keys), gate, in and out (8x16 each); two FLOP per multiply-add."""
    macs = tokens * (8 * 8 + 8 * 4 + 8 * 4 + 8 * 8 + 2 * (2 * 4 * keys) + 3 * 8 * 16)
    return 2 * macs


def test_fast_flops_equal_a_count_by_enumeration():
    """Every wait, every configuration and every block enumerated, with the tiny model's matrices by hand."""
    n, pos, k, distinct = 5, 6, 2, 3
    prefix = tails = unembed = 0
    for w in range(-1, 3):
        for _block in range(w + 1, 3):  # transfer blocks of the prefix: every position of every prompt
            prefix += by_hand_block(n * pos, pos)
        for t in range(0, 3 - w):
            rows = (distinct if t == 0 else n) * k
            for _block in range(w + 1 + t, 3):  # self-peek tail: BOS and itself
                tails += by_hand_block(rows, 2)
            unembed += 2 * rows * 8 * 11
    assert fast_flops(TINY, n, pos, k, n_distinct=distinct) == {"prefix": prefix, "tails": tails, "unembed": unembed}
    # the baselines: one prompt after every wait >= 0 (wait -1 is no ablation: every prompt)
    shared = fast_flops(TINY, n, pos, k, shared=True)
    assert shared["prefix"] == 3 * by_hand_block(n * pos, pos) + (2 + 1) * by_hand_block(pos, pos)
    configs = sum(3 - w for w in range(-1, 3))
    assert configs == 10
    assert naive_flops(TINY, n, pos) == configs * (3 * by_hand_block(n * pos, pos) + 2 * n * pos * 8 * 11)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_block_flops_equal_what_torch_counts(arch, backend):
    """One block of a tiny model run through ``run_from``: torch's own FLOP counter (matmuls, attention
    included) sees what :meth:`Dims.block_flops` counts, and the unembedding likewise."""
    import interventions as iv

    model = build_model(arch, backend)
    dims = Dims.of(model.cfg)
    ad = iv.adapt(model)
    x = torch.randn(3, 5, dims.d_model)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        ad.run_from(x, 1, 2)
    assert counter.get_total_flops() == dims.block_flops(3 * 5, 5)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        ad.unembed(x[:, 0])
    assert counter.get_total_flops() == dims.unembed_flops(3)
