"""HeadAblation against weight editing (zero) and an independent mean of ``hook_z`` (mean)."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from tests.conftest import random_tokens
from tests.interventions.reference import without_heads, z_means

HEADS = [(0, 1), (2, 0), (2, 3)]


def test_zero_head_ablation_equals_zeroed_output_weights(model):
    tokens = random_tokens(6, 7, seed=20)
    got = iv.run(model, tokens, [iv.HeadAblation(HEADS, method="zero")])
    ref = without_heads(model, HEADS)(tokens)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert (got - model(tokens)).abs().max() > 1e-2


def test_each_query_head_is_separate_also_with_grouped_query_attention(model):
    """Ablating query head 0 is not ablating head 1, even when both share a key/value head."""
    tokens = random_tokens(4, 7, seed=21)
    a = iv.run(model, tokens, [iv.HeadAblation([(1, 0)])])
    b = iv.run(model, tokens, [iv.HeadAblation([(1, 1)])])
    assert (a - b).abs().max() > 1e-3
    torch.testing.assert_close(b, without_heads(model, [(1, 1)])(tokens), atol=1e-5, rtol=1e-5)


def test_mean_head_ablation_equals_independent_mean(model):
    fit = random_tokens(200, 6, seed=22, values=8)
    cache = iv.MeanCache.fit(model, fit, progress=False)
    tokens = random_tokens(5, 6, seed=23, values=8)
    means = {layer: z_means(model, fit, layer) for layer in (0, 2)}

    def hook_for(layer, heads):
        def hook(z, hook=None):
            z = z.clone()
            z[:, :, heads] = means[layer][:, heads]
            return z
        return hook

    ref = model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.attn.hook_z", hook_for(0, [1])), ("blocks.2.attn.hook_z", hook_for(2, [0, 3]))]
    )
    got = iv.run(model, tokens, [iv.HeadAblation(HEADS, method="mean", cache=cache)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert (got - iv.run(model, tokens, [iv.HeadAblation(HEADS)])).abs().max() > 1e-3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(heads=[(0, 1)], method="resample"), "method='resample'"),
        (dict(heads=[(0, 1)], method="mean"), "needs cache"),
        (dict(heads=[(0,)]), "pair"),
        (dict(heads=[(0, -1)]), "pair"),
        (dict(heads=[(0, 1), (0, 1)]), "twice"),
    ],
)
def test_head_ablation_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        iv.HeadAblation(**kwargs)


def test_head_out_of_range_names_the_range(model):
    with pytest.raises(ValueError, match=r"head=4 of layer 1 is out of range.*0\.\.3"):
        iv.run(model, random_tokens(2, 5), [iv.HeadAblation([(1, 4)])])
    with pytest.raises(ValueError, match=r"out of range.*0\.\.3"):
        iv.run(model, random_tokens(2, 5), [iv.HeadAblation([(9, 0)])])
