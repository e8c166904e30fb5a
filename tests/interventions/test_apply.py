"""apply/run: composition, cleanup, fired-hook checks, batch independence, specs, bad input."""

from __future__ import annotations

import json

import pytest
import torch

import interventions as iv
from interventions.backends.bridge import transformer_lens_major
from tests.conftest import N_LAYERS, ForwardStopped, random_tokens, token_devices
from tests.interventions.reference import cama_hook, conditional_means, peek_allowed, score_mask_hook

VALUES = 6


@pytest.fixture(scope="module")
def fit_tokens():
    return random_tokens(300, 6, seed=30, values=VALUES)


@pytest.fixture(scope="module")
def cache(model, fit_tokens):
    return iv.MeanCache.fit(model, fit_tokens, progress=False)


def _hook_counts(model) -> int:
    return sum(len(hp.fwd_hooks) + len(hp._forward_hooks) for hp in model.hook_dict.values()) + len(
        model._forward_pre_hooks
    ) + len(model.embed._forward_pre_hooks)


@pytest.mark.parametrize("wait,transfer", [(0, 1), (1, 2), (-1, 2), (2, 0), (3, 0)])
def test_af1_composition_equals_independent_composition(model, fit_tokens, cache, wait, transfer):
    tokens = random_tokens(8, 6, seed=31, values=VALUES)
    hooks = []
    if wait >= 0:
        hooks.append((f"blocks.{wait}.hook_resid_post", cama_hook(conditional_means(model, fit_tokens, wait), tokens)))
    transfer_mask = peek_allowed(6, "self", "others")  # last row full, others self
    compute_mask = peek_allowed(6, "self", "all")
    for layer in range(wait + 1, N_LAYERS):
        mask = transfer_mask if layer <= wait + transfer else compute_mask
        hooks.append((f"blocks.{layer}.attn.hook_attn_scores", score_mask_hook(mask)))
    ref = model.run_with_hooks(tokens, fwd_hooks=hooks)
    got = iv.run(model, tokens, iv.af1_subgraph(N_LAYERS, wait, transfer, cache))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert (got - model(tokens)).abs().max() > 1e-2


def test_af1_subgraph_shape_and_range_errors(cache):
    ivs = iv.af1_subgraph(N_LAYERS, 1, 1, cache)
    assert ivs == [
        iv.CAMA(cache, layer=1),
        iv.Peek([2], "full", "last"),
        iv.Peek([2], "self", "others"),
        iv.Peek([3], "self", "all"),
    ]
    with pytest.raises(ValueError, match=r"wait=4 is out of range: valid -1\.\.3"):
        iv.af1_subgraph(N_LAYERS, 4, 0, cache)
    with pytest.raises(ValueError, match=r"transfer=3 is out of range for wait=1: valid 0\.\.2"):
        iv.af1_subgraph(N_LAYERS, 1, 3, cache)
    with pytest.raises(ValueError, match="ablation='resample'"):
        iv.af1_subgraph(N_LAYERS, 1, 1, cache, ablation="resample")


def test_apply_restores_the_model_bit_identically(model, cache):
    tokens = random_tokens(4, 6, seed=32, values=VALUES)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n_hooks = _hook_counts(model)
    plain = model(tokens)
    with iv.apply(model, iv.af1_subgraph(N_LAYERS, 1, 1, cache) + [iv.HeadAblation([(2, 1)])]):
        assert _hook_counts(model) > n_hooks
        assert (model(tokens) - plain).abs().max() > 1e-3
    assert _hook_counts(model) == n_hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(tokens), plain)


def test_apply_cleans_up_after_an_exception(model, cache):
    tokens = random_tokens(4, 6, seed=33, values=VALUES)
    n_hooks, plain = _hook_counts(model), model(tokens)
    with pytest.raises(RuntimeError, match="boom"):
        with iv.apply(model, [iv.Peek([0, 1], "self")]):
            model(tokens)
            raise RuntimeError("boom")
    assert _hook_counts(model) == n_hooks
    bad = tokens.clone()
    bad[0, 3] = 30  # unseen by the cache: the hook itself raises inside the forward pass
    with pytest.raises(iv.CacheMismatchError):
        with iv.apply(model, [iv.CAMA(cache, layer=0)]):
            model(bad)
    assert _hook_counts(model) == n_hooks
    assert torch.equal(model(tokens), plain)


def test_apply_leaves_other_hooks_alone(model):
    tokens = random_tokens(2, 6, seed=34)
    seen = []
    model.add_hook("blocks.0.hook_resid_post", lambda act, hook: seen.append(1))
    try:
        with iv.apply(model, [iv.Peek([0], "self")]):
            model(tokens)
        model(tokens)
        assert len(seen) == 2
    finally:
        model.reset_hooks()


def test_apply_raises_when_a_hook_never_fired(model, cache):
    tokens = random_tokens(2, 6, seed=35, values=VALUES)
    with pytest.raises(iv.InterventionNotAppliedError, match="never fired"):
        with iv.apply(model, [iv.CAMA(cache, layer=3)]):
            model(tokens, stop_at_layer=2)  # block 3 never runs
    with iv.apply(model, [iv.CAMA(cache, layer=3)], check_fired=False):
        model(tokens, stop_at_layer=2)
    with iv.apply(model, [iv.CAMA(cache, layer=3)]):
        pass  # no forward pass, nothing to check


def test_cama_from_a_residual_needs_explicit_tokens(model, backend, cache):
    """Starting mid-model (start_at_layer) skips the embedding: tokens come from apply(tokens=...)."""
    if backend == "bridge" and transformer_lens_major() < 4:
        pytest.skip("the TransformerBridge of transformer-lens 3.9 has no start_at_layer")
    tokens = random_tokens(3, 6, seed=36, values=VALUES)
    resid = model(tokens, stop_at_layer=1)
    ref = iv.run(model, tokens, [iv.CAMA(cache, layer=2)])
    with iv.apply(model, [iv.CAMA(cache, layer=2)], tokens=tokens):
        got = model(resid, start_at_layer=1)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="token ids"):
        with iv.apply(model, [iv.CAMA(cache, layer=2)]):
            model(resid, start_at_layer=1)


def test_results_do_not_depend_on_the_batch(model, cache):
    tokens = random_tokens(9, 6, seed=38, values=VALUES)
    ivs = iv.af1_subgraph(N_LAYERS, 0, 2, cache) + [iv.HeadAblation([(1, 2)], "mean", cache)]
    batched = iv.run(model, tokens, ivs)
    for b in range(tokens.shape[0]):
        torch.testing.assert_close(iv.run(model, tokens[b : b + 1], ivs), batched[b : b + 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(iv.run(model, tokens.flip(0), ivs), batched.flip(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "tokens,match",
    [
        (torch.zeros(0, 6, dtype=torch.long), "empty"),
        (torch.zeros(2, 6), "dtype"),
        (torch.zeros(6, dtype=torch.long), r"\[batch, pos\]"),
        ([[0, 1, 2]], "LongTensor"),
        (torch.full((1, 6), 99), r"token id 99 is out of range: valid ids are 0\.\.39"),
    ],
)
def test_run_rejects_bad_tokens(model, tokens, match):
    with pytest.raises(ValueError, match=match):
        iv.run(model, tokens, [iv.Peek([0])])


def test_run_and_run_many_put_token_ids_on_the_model_device(model, cache):
    """Token ids built on the CPU reach the model on its device, with and without interventions (a bridge on
    a GPU would otherwise fail in its embedding)."""
    tokens = random_tokens(2, 6, values=VALUES)
    calls = [lambda: iv.run(model, tokens, [iv.CAMA(cache, layer=1)]),
             lambda: iv.run_many(model, [(tokens, [])]),
             lambda: iv.run_many(model, [(tokens, [iv.Peek([0])])])]
    with token_devices(model) as seen:
        for call in calls:
            with pytest.raises(ForwardStopped):
                call()
    assert seen == [torch.device("meta")] * len(calls)


def test_bad_layer_and_intervention_objects(model, cache):
    with pytest.raises(ValueError, match=r"layer=-2 must be an integer >= 0"):
        iv.ZeroAblation(layer=-2)
    with pytest.raises(ValueError, match=r"ZeroAblation layer=4 is out of range.*0\.\.3"):
        iv.run(model, random_tokens(1, 6), [iv.ZeroAblation(layer=4)])
    with pytest.raises(ValueError, match="Intervention objects"):
        iv.run(model, random_tokens(1, 6), ["CAMA"])
    with pytest.raises(ValueError, match="needs a MeanCache"):
        iv.CAMA(None, layer=0)
    with pytest.raises(ValueError, match="position 9 is out of range"):
        iv.run(model, random_tokens(1, 6), [iv.ZeroAblation(layer=0, positions=[9])])


def test_specs_round_trip_through_json(tmp_path, cache):
    cache.save(tmp_path / "means.safetensors")
    items = iv.af1_subgraph(N_LAYERS, 1, 1, cache) + [
        iv.HeadAblation([(2, 1), (3, 0)], "mean", cache),
        iv.MeanAblation(cache, layer=0, positions=[1, 2]),
        iv.ZeroAblation(layer=2),
    ]
    text = json.dumps([item.to_dict() for item in items])
    assert iv.Intervention.from_dict(json.loads(text)[0], cache=cache) == items[0]
    rebuilt = [iv.Intervention.from_dict(spec) for spec in json.loads(text)]  # caches loaded by path
    assert rebuilt == items
    assert "Peek(layers=(2,), mode='full', queries='last', keep_bos=True)" == repr(items[1])
    assert "sha256=" in repr(items[0])
    with pytest.raises(ValueError, match="unknown intervention type 'Resample'"):
        iv.Intervention.from_dict({"type": "Resample"})
