"""MeanCache and CAMA / MeanAblation / ZeroAblation against independent recomputations."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from tests.conftest import D_VOCAB, build_model, random_tokens
from tests.interventions.reference import cama_hook, conditional_means

N_FIT = 300
VALUES = 6  # token ids 1..6 at every position: every (position, token) pair is covered


@pytest.fixture(scope="module")
def fit_tokens():
    return random_tokens(N_FIT, 6, seed=10, values=VALUES)


@pytest.fixture(scope="module")
def cache(model, fit_tokens):
    return iv.MeanCache.fit(model, fit_tokens, batch_size=64, progress=False)


def test_cache_means_equal_dictionary_means(model, fit_tokens, cache):
    for layer in (0, 2, 3):
        ref = conditional_means(model, fit_tokens, layer)
        for (t, tok), mean in ref.items():
            torch.testing.assert_close(cache.mean(layer, t, token=tok), mean, atol=1e-5, rtol=1e-5)
            assert cache.count(t, tok) == int((fit_tokens[:, t] == tok).sum())
        _, acts = model.run_with_cache(fit_tokens, names_filter=f"blocks.{layer}.hook_resid_post")
        plain = acts[f"blocks.{layer}.hook_resid_post"].double().mean(0).float()
        for t in range(6):
            torch.testing.assert_close(cache.mean(layer, t), plain[t], atol=1e-5, rtol=1e-5)


def test_cache_is_independent_of_batch_size(model, fit_tokens, cache):
    other = iv.MeanCache.fit(model, fit_tokens, batch_size=128, progress=False)  # 3 uneven batches vs 5
    torch.testing.assert_close(other.cond_mean, cache.cond_mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(other.z_mean, cache.z_mean, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layer", [0, 2])
def test_cama_equals_independent_recomputation(model, fit_tokens, cache, layer):
    tokens = random_tokens(10, 6, seed=11, values=VALUES)
    means = conditional_means(model, fit_tokens, layer)
    ref = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_resid_post", cama_hook(means, tokens))])
    got = iv.run(model, tokens, [iv.CAMA(cache, layer=layer)])
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert (got - model(tokens)).abs().max() > 1e-2, "CAMA must change the logits"


def test_cama_keeps_token_identity_and_erases_context(model, cache):
    """After CAMA at the last block, a position's residual depends only on its own token."""
    tokens = random_tokens(6, 6, seed=12, values=VALUES)
    changed = tokens.clone()
    changed[:, 1:-1] = (changed[:, 1:-1] % VALUES) + 1
    ivs = [iv.CAMA(cache, layer=3)]
    torch.testing.assert_close(iv.run(model, tokens, ivs)[:, -1], iv.run(model, changed, ivs)[:, -1], atol=1e-5, rtol=0)
    last_changed = tokens.clone()
    last_changed[:, -1] = (last_changed[:, -1] % VALUES) + 1
    assert (iv.run(model, tokens, ivs)[:, -1] - iv.run(model, last_changed, ivs)[:, -1]).abs().max() > 1e-2


def test_cama_unseen_pair_raises_naming_position_and_token(model, cache):
    tokens = random_tokens(3, 6, seed=13, values=VALUES)
    tokens[1, 4] = 20  # never seen at position 4
    with pytest.raises(iv.CacheMismatchError, match=r"token id 20 at position 4|'w18' \(id 20\) at position 4"):
        iv.run(model, tokens, [iv.CAMA(cache, layer=1)])


def test_cama_other_layout_raises_naming_lengths(model, cache):
    with pytest.raises(iv.CacheMismatchError, match=r"prompt length 7 .* 6 tokens"):
        iv.run(model, random_tokens(3, 7, values=VALUES), [iv.CAMA(cache, layer=1)])


def test_mean_and_zero_ablation(model, fit_tokens, cache):
    tokens = random_tokens(4, 6, seed=14, values=VALUES)
    _, acts = model.run_with_cache(fit_tokens, names_filter="blocks.1.hook_resid_post")
    plain = acts["blocks.1.hook_resid_post"].mean(0)

    def set_to(values, positions):
        def hook(resid, hook=None):
            resid = resid.clone()
            resid[:, positions] = values[positions] if values is not None else 0.0
            return resid
        return hook

    ref = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", set_to(plain, list(range(1, 6))))])
    torch.testing.assert_close(iv.run(model, tokens, [iv.MeanAblation(cache, layer=1)]), ref, atol=1e-4, rtol=1e-4)
    ref = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", set_to(plain, [2, 5]))])
    torch.testing.assert_close(iv.run(model, tokens, [iv.MeanAblation(cache, layer=1, positions=[2, -1])]), ref, atol=1e-4, rtol=1e-4)
    ref = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", set_to(None, [0, 3]))])
    torch.testing.assert_close(iv.run(model, tokens, [iv.ZeroAblation(layer=1, positions=[0, 3])]), ref, atol=1e-5, rtol=0)
    ref = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_post", set_to(None, list(range(1, 6))))])
    got = iv.run(model, tokens, [iv.ZeroAblation(layer=1)])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (got - model(tokens)).abs().max() > 1e-2


def test_cache_round_trip_is_identical(tmp_path, cache):
    path = cache.save(tmp_path / "means.safetensors")
    loaded = iv.MeanCache.load(path)
    for name, tensor in cache.tensors().items():
        assert torch.equal(loaded.tensors()[name], tensor), name
    assert loaded == cache and loaded.n_prompts == N_FIT and loaded.model_signature == cache.model_signature
    assert loaded.source == str(path)


def test_cache_load_rejects_foreign_and_corrupt_files(tmp_path, cache):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a MeanCache"):
        iv.MeanCache.load(tmp_path / "other.safetensors")
    with pytest.raises(FileNotFoundError):
        iv.MeanCache.load(tmp_path / "missing.safetensors")


def test_cache_of_another_model_is_rejected(arch, backend, cache):
    other = build_model(arch, backend, seed=123)
    with pytest.raises(iv.CacheMismatchError, match="another model"):
        iv.run(other, random_tokens(2, 6, values=VALUES), [iv.CAMA(cache, layer=0)])
    deeper = build_model(arch, backend, n_layers=5)
    with pytest.raises(iv.CacheMismatchError, match="n_layers"):
        iv.run(deeper, random_tokens(2, 6, values=VALUES), [iv.CAMA(cache, layer=0)])


def test_cache_reading_errors(cache):
    with pytest.raises(ValueError, match=r"layer=4 is out of range.*0\.\.3"):
        cache.mean(4, 1)
    with pytest.raises(ValueError, match=r"position=6 is out of range"):
        cache.mean(0, 6)
    with pytest.raises(iv.CacheMismatchError, match="no mean for token id 30 at position 2"):
        cache.mean(0, 2, token=30)
    with pytest.raises(ValueError, match=r"layer=7 is out of range"):
        iv.CAMA(cache, layer=7)


def test_fit_rejects_bad_tokens(model):
    with pytest.raises(ValueError, match="dtype"):
        iv.MeanCache.fit(model, torch.zeros(3, 5), progress=False)
    with pytest.raises(ValueError, match="empty"):
        iv.MeanCache.fit(model, torch.zeros(0, 5, dtype=torch.long), progress=False)
    with pytest.raises(ValueError, match=rf"0\.\.{D_VOCAB - 1}"):
        iv.MeanCache.fit(model, torch.full((2, 5), D_VOCAB), progress=False)
