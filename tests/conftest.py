"""Tiny randomly initialised models of several architecture families, shared by all tests."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))

ARCHS = ("gpt2", "neox", "gptj", "llama")
N_LAYERS = 4
D_VOCAB = 40


def arch_config(arch: str, n_layers: int = N_LAYERS, d_vocab: int = D_VOCAB, seed: int = 0) -> dict:
    """HookedTransformerConfig fields of a tiny model shaped like ``arch``."""
    base = dict(
        n_layers=n_layers, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=d_vocab,
        act_fn="gelu", seed=seed, initializer_range=0.2, default_prepend_bos=True,
    )
    shapes = {
        "gpt2": dict(normalization_type="LN", positional_embedding_type="standard"),
        "neox": dict(normalization_type="LN", positional_embedding_type="rotary", rotary_dim=4,
                     parallel_attn_mlp=True),
        "gptj": dict(normalization_type="LN", positional_embedding_type="rotary", rotary_dim=4,
                     parallel_attn_mlp=True, rotary_adjacent_pairs=True),
        "llama": dict(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=8,
                      gated_mlp=True, act_fn="silu", n_key_value_heads=2, final_rms=True),
    }
    return {**base, **shapes[arch]}


def build_hooked(arch: str, **kwargs):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model = HookedTransformer(HookedTransformerConfig(**arch_config(arch, **kwargs)))
    return model.eval()


@pytest.fixture(scope="session", params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def model(arch):
    """A tiny random model of one architecture (``arch``): 4 blocks, vocab 40, BOS id 0."""
    torch.manual_seed(0)
    return build_hooked(arch)


def random_tokens(n: int, n_pos: int, d_vocab: int = D_VOCAB, seed: int = 0, values: int | None = None):
    """``[n, n_pos]`` token ids with BOS (0) at position 0; positions >= 1 draw from ``values`` ids."""
    g = torch.Generator().manual_seed(seed)
    hi = d_vocab if values is None else values + 1
    toks = torch.randint(1, hi, (n, n_pos), generator=g)
    toks[:, 0] = 0
    return toks
