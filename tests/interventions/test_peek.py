"""Peek (attention-based peeking) against independent masks and influence checks."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from tests.conftest import N_LAYERS, random_tokens
from tests.interventions.reference import head_score_mask_hook, peek_allowed, score_mask_hook

ALL = list(range(N_LAYERS))


@pytest.mark.parametrize("mode,queries", [("self", "all"), ("self", "last"), ("self", "others"), ("full", "last")])
@pytest.mark.parametrize("keep_bos", [True, False])
def test_peek_equals_independent_score_mask(model, mode, queries, keep_bos):
    tokens = random_tokens(6, 7, seed=1)
    layers = [1, 3]
    allowed = peek_allowed(7, mode, queries, keep_bos)
    ref = model.run_with_hooks(
        tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_attn_scores", score_mask_hook(allowed)) for l in layers]
    )
    got = iv.run(model, tokens, [iv.Peek(layers, mode=mode, queries=queries, keep_bos=keep_bos)])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    if mode == "self":
        assert (got - model(tokens)).abs().max() > 1e-3, "self peek must change the logits"


def test_allowed_keys_matches_elementwise_definition():
    for n in (1, 2, 5):
        for mode in ("full", "self"):
            for queries in ("last", "others", "all"):
                for keep_bos in (True, False):
                    assert torch.equal(
                        iv.allowed_keys(n, mode, queries, keep_bos), peek_allowed(n, mode, queries, keep_bos)
                    )


def test_self_peek_everywhere_isolates_last_token(model):
    """With self peek in every block, the last position sees only BOS and itself."""
    tokens = random_tokens(8, 7, seed=2)
    changed = tokens.clone()
    changed[:, 1:-1] = (changed[:, 1:-1] % 38) + 1  # every middle token differs
    assert (changed[:, 1:-1] != tokens[:, 1:-1]).all()
    peek = [iv.Peek(ALL, mode="self", queries="all")]
    a = iv.run(model, tokens, peek)[:, -1]
    b = iv.run(model, changed, peek)[:, -1]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # ... and without the intervention the middle tokens do matter.
    assert (model(tokens)[:, -1] - model(changed)[:, -1]).abs().max() > 1e-2


def test_self_peek_without_bos_isolates_from_bos_too(model):
    tokens = random_tokens(4, 6, seed=3)
    other_bos = tokens.clone()
    other_bos[:, 0] = 5
    peek = [iv.Peek(ALL, mode="self", queries="all", keep_bos=False)]
    torch.testing.assert_close(iv.run(model, tokens, peek)[:, -1], iv.run(model, other_bos, peek)[:, -1], atol=1e-5, rtol=0)
    kept = [iv.Peek(ALL, mode="self", queries="all", keep_bos=True)]
    assert (iv.run(model, tokens, kept)[:, -1] - iv.run(model, other_bos, kept)[:, -1]).abs().max() > 1e-3


def test_full_peek_everywhere_is_the_plain_model(model):
    tokens = random_tokens(5, 7, seed=4)
    got = iv.run(model, tokens, [iv.Peek(ALL, mode="full", queries="all")])
    torch.testing.assert_close(got, model(tokens), atol=1e-6, rtol=0)


def test_last_token_full_peek_others_self_lets_middle_tokens_reach_last_only_directly(model):
    """Transfer pattern in block 0 only, self peek afterwards: a middle token reaches the last
    position (through the last row's full attention) but not the position after it."""
    tokens = random_tokens(6, 7, seed=5)
    changed = tokens.clone()
    changed[:, 2] = (changed[:, 2] % 38) + 1
    ivs = [
        iv.Peek([0], "full", "last"),
        iv.Peek([0], "self", "others"),
        iv.Peek(list(range(1, N_LAYERS)), "self", "all"),
    ]
    a, b = iv.run(model, tokens, ivs), iv.run(model, changed, ivs)
    torch.testing.assert_close(a[:, 3:-1], b[:, 3:-1], atol=1e-5, rtol=0)  # positions 3..5 blind to 2
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3  # the last position still sees it


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(layers=[0], mode="window"), "mode='window'"),
        (dict(layers=[0], queries="first"), "queries='first'"),
        (dict(layers=[-1]), "layer -1"),
        (dict(layers=[0, 0]), "twice"),
        (dict(layers=[0], keep_bos="yes"), "keep_bos"),
    ],
)
def test_peek_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        iv.Peek(**kwargs)


def test_peek_layer_out_of_range_names_the_range(model):
    with pytest.raises(ValueError, match=r"layer=4 is out of range.*0\.\.3"):
        iv.run(model, random_tokens(2, 5), [iv.Peek([4])])


def test_a_peek_reused_across_inference_mode_and_autograd(model):
    """The same applied Peek first runs under ``torch.inference_mode()`` and then in a pass autograd
    records (as a permanent planted mask does): no inference tensor may leak into the second pass."""
    tokens = random_tokens(2, 6, seed=61)
    with iv.apply(model, [iv.Peek([0, 1], mode="self", queries="all")]):
        with torch.inference_mode():
            first = model(tokens)
        second = model(tokens)
        second.sum().backward()
    torch.testing.assert_close(second.detach(), first.clone())
    model.zero_grad(set_to_none=True)


HEAD_CASES = [
    # (layers, heads as given, heads per block for the reference)
    ([1, 3], (0, 3), {1: (0, 3), 3: (0, 3)}),
    ([], {1: (2,), 3: (0, 1, 3)}, {1: (2,), 3: (0, 1, 3)}),
    ([0, 2], [[2, [1]], [0, [3, 0]]], {0: (3, 0), 2: (1,)}),  # the spec form, in any order
]


@pytest.mark.parametrize("mode,queries,keep_bos", [("self", "all", True), ("self", "last", True),
                                                   ("self", "others", False)])
@pytest.mark.parametrize("case", range(len(HEAD_CASES)))
def test_head_peek_equals_independent_per_head_score_mask(model, mode, queries, keep_bos, case):
    """Only the chosen query heads are restricted (with grouped-query attention too: ``llama`` has 4 query
    heads on 2 key-value heads); the others keep their causal rows."""
    layers, heads, per_block = HEAD_CASES[case]
    tokens = random_tokens(5, 7, seed=31)
    n_heads = model.cfg.n_heads
    allowed = peek_allowed(7, mode, queries, keep_bos)
    ref = model.run_with_hooks(tokens, fwd_hooks=[
        (f"blocks.{l}.attn.hook_attn_scores", head_score_mask_hook(allowed, hs, n_heads)) for l, hs in per_block.items()])
    peek = iv.Peek(layers, mode=mode, queries=queries, keep_bos=keep_bos, heads=heads)
    assert sorted(peek.layers) == sorted(per_block) and all(peek.heads_of(l) == hs for l, hs in per_block.items())
    got = iv.run(model, tokens, [peek])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    whole = iv.run(model, tokens, [iv.Peek(sorted(per_block), mode=mode, queries=queries, keep_bos=keep_bos)])
    assert (got - model(tokens)).abs().max() > 1e-3, "a head peek must change the logits"
    assert (got - whole).abs().max() > 1e-3, "restricting some heads differs from restricting all of them"


def test_every_head_named_is_the_whole_block_peek(model):
    tokens = random_tokens(4, 6, seed=32)
    every = iv.Peek([0, 2], "self", "last", heads=tuple(range(model.cfg.n_heads)))
    torch.testing.assert_close(iv.run(model, tokens, [every]), iv.run(model, tokens, [iv.Peek([0, 2], "self", "last")]),
                               atol=1e-6, rtol=0)


def test_head_peek_spec_round_trip():
    import json

    for peek in (iv.Peek([1, 3], "self", "last", heads=(0, 3)), iv.Peek([], "self", heads={3: [1], 1: (2, 0)})):
        spec = json.loads(json.dumps(peek.to_dict()))
        assert iv.Intervention.from_dict(spec) == peek and "heads" in repr(peek)
    assert "heads" not in iv.Peek([1]).to_dict()  # specs written before heads existed are unchanged
    assert iv.Peek([], heads={3: [1], 1: (2, 0)}).layers == (1, 3)


@pytest.mark.parametrize("kwargs,match", [
    (dict(layers=[0], heads=[]), "non-empty"),
    (dict(layers=[0], heads=[1, 1]), "twice"),
    (dict(layers=[0], heads=[-1]), "integers >= 0"),
    (dict(layers=[0], heads="0"), "must be a list"),
    (dict(layers=[0, 1], heads={0: [1]}), r"heads name blocks \[0\] but layers are \[0, 1\]"),
])
def test_head_peek_rejects_bad_heads(kwargs, match):
    with pytest.raises(ValueError, match=match):
        iv.Peek(**kwargs)


def test_head_peek_head_out_of_range_names_the_range(model):
    with pytest.raises(ValueError, match=r"head=4 of layer 1 is out of range: valid query heads are 0\.\.3"):
        iv.run(model, random_tokens(2, 5), [iv.Peek([1], heads=(0, 4))])
