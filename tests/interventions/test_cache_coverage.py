"""What a MeanCache covers, and extending it with new fit prompts, against independent computations: counts
and missing pairs counted by hand, the extended means against a fit on both prompt sets together and against
means built with a dictionary, and the uncovered-token error naming its tokens as the tokenizer spells them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import interventions as iv
from interventions.coverage import row_digests
from tests.conftest import build_model, random_tokens
from tests.interventions.reference import cama_hook, conditional_means

N_POS = 6


@pytest.fixture(scope="module")
def first(model):
    """Fit prompts A (ids 1..4 at every position) and their cache."""
    tokens = random_tokens(160, N_POS, seed=21, values=4)
    return tokens, iv.MeanCache.fit(model, tokens, batch_size=48, progress=False)


def more_prompts(old: torch.Tensor) -> torch.Tensor:
    """Fit prompts B: ids 1..6, so B holds (position, token) pairs A never did; none of A's rows."""
    new = random_tokens(120, N_POS, seed=22, values=6)
    return new[~torch.isin(row_digests(new), row_digests(old))]


def test_extend_equals_a_fit_on_both_sets(model, first):
    a, cache = first
    b = more_prompts(a)
    before = {name: t.clone() for name, t in cache.tensors().items()}
    grown = cache.extend(model, b, batch_size=32, progress=False)
    both = iv.MeanCache.fit(model, torch.cat([a, b]), batch_size=64, progress=False)
    for name in ("entry_pos", "entry_tok", "entry_count", "fit_rows"):
        assert torch.equal(getattr(grown, name), getattr(both, name)), name
    for name in ("cond_mean", "pos_mean", "z_mean"):
        torch.testing.assert_close(getattr(grown, name), getattr(both, name), atol=1e-5, rtol=1e-5)
    assert grown.n_prompts == both.n_prompts == len(a) + len(b)
    assert len(grown.entry_pos) > len(cache.entry_pos)  # B brought pairs A never held
    for name, t in cache.tensors().items():  # the extended cache is a new one
        assert torch.equal(t, before[name]), name
    # ... and its means are the dictionary means of A and B together (independent of the package's sums).
    ref = conditional_means(model, torch.cat([a, b]), 2)
    for (t, tok), mean in ref.items():
        torch.testing.assert_close(grown.mean(2, t, token=tok), mean, atol=1e-5, rtol=1e-5)


def test_a_saved_and_reloaded_cache_extends_the_same(model, first, tmp_path):
    a, cache = first
    b = more_prompts(a)
    loaded = iv.MeanCache.load(cache.save(tmp_path / "means.safetensors"))
    x, y = loaded.extend(model, b, progress=False), cache.extend(model, b, progress=False)
    assert x == y  # same content hash


def test_coverage_and_covers_equal_counting_by_hand(model, first):
    a, cache = first
    scored = random_tokens(30, N_POS, seed=23, values=6)
    held = Counter((t, tok) for row in a.tolist() for t, tok in enumerate(row))
    needed = {(t, tok) for row in scored.tolist() for t, tok in enumerate(row) if t >= 1}
    cov = cache.coverage(scored)
    assert {(e.position, e.token): e.count for e in cov.entries} == {k: held[k] for k in needed}
    assert {(e.position, e.token) for e in cov.missing} == {k for k in needed if held[k] == 0} != set()
    expect = [all(held[(t, tok)] > 0 for t, tok in enumerate(row) if t >= 1) for row in scored.tolist()]
    assert cache.covers(scored).tolist() == expect and 0 < sum(expect) < len(expect)
    assert not cache.covers(random_tokens(3, N_POS + 1, seed=1, values=4)).any()  # another layout
    rows = cov.rows()
    assert [(r["position"], r["token"], r["count"]) for r in rows] == [(e.position, e.token, e.count) for e in cov.entries]
    with pytest.raises(iv.UncoveredEntryError):
        iv.run(model, scored, [iv.CAMA(cache, layer=1)])
    # Extending with fit prompts that hold the missing pairs makes CAMA run, with the means of A and B.
    b = more_prompts(a)
    grown = cache.extend(model, b, progress=False)
    assert grown.covers(scored).all() and grown.coverage(scored).missing == ()
    means = conditional_means(model, torch.cat([a, b]), 1)
    ref = model.run_with_hooks(scored, fwd_hooks=[("blocks.1.hook_resid_post", cama_hook(means, scored))])
    torch.testing.assert_close(iv.run(model, scored, [iv.CAMA(grown, layer=1)]), ref, atol=1e-4, rtol=1e-4)


def test_uncovered_tokens_are_named_as_text_with_the_fix(model, first):
    """A hooked model of the suite has no tokenizer (the id alone); the bridge's word tokenizer spells id ``i``
    as ``w{i-2}``."""
    _, cache = first
    tokens = random_tokens(3, N_POS, seed=24, values=4)
    tokens[1, 4], tokens[2, 2] = 20, 33
    spell = (lambda i: f"'w{i - 2}' (id {i})") if getattr(model, "tokenizer", None) is not None else \
        (lambda i: f"token id {i}")
    with pytest.raises(iv.CacheMismatchError) as err:
        iv.run(model, tokens, [iv.CAMA(cache, layer=1)])
    text = str(err.value)
    assert f"no mean for {spell(20)} at position 4 (prompt 1 of the batch)" in text
    assert f"({spell(20)} at position 4, {spell(33)} at position 2;" in text
    assert "cache.extend(model, more_fit_tokens)" in text and "MeanCache.fit" in text
    assert err.value.pairs == [(4, 20), (2, 33)]
    with pytest.raises(iv.CacheMismatchError, match=r"no mean for token id 30 at position 2: none of its 160"):
        cache.mean(0, 2, token=30)


def test_extend_refusals(model, first, arch, backend):
    a, cache = first
    with pytest.raises(iv.CacheMismatchError, match=r"5 of these 5 prompts are already in the cache's fit set"):
        cache.extend(model, a[:5], progress=False)
    with pytest.raises(iv.CacheMismatchError, match=r"prompt length 7 differs .* 6 tokens"):
        cache.extend(model, random_tokens(4, 7, seed=3, values=4), progress=False)
    with pytest.raises(iv.CacheMismatchError, match="another model"):
        cache.extend(build_model(arch, backend, seed=123), more_prompts(a), progress=False)
