"""The analyses give the same numbers on a ``TransformerBridge`` as on its ``HookedTransformer`` twin
(same weights): early decoding, the necessity sweep, head pruning and ``load_model``'s backend choice.

Needs both backends, i.e. TransformerLens 3.9; on 4.x the same analyses run on the bridge through the
rest of ``tests/circuits`` (the default backend there is then ``bridge``)."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from circuits.lens import decode_states, lens_states
from circuits.models import loading
from circuits.necessity import necessity_sweep
from circuits.prune import prune_heads
from tests.conftest import build_bridge, build_hooked, disjoint_fit_tokens, needs_hooked, random_tokens

pytestmark = needs_hooked


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def twins(request):
    return build_hooked(request.param), build_bridge(request.param)


def own_answers(model, tokens):
    with torch.inference_mode():
        return model(tokens)[:, -1].argmax(-1)


def test_lens_states_and_decoding_agree(twins):
    hooked, bridge = twins
    tokens = random_tokens(6, 6, seed=11)
    a, b = lens_states(hooked, tokens), lens_states(bridge, tokens)
    assert a.keys() == b.keys() and len(a) == 8  # 4 blocks x (attn, mlp)
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=0)
        torch.testing.assert_close(decode_states(bridge, b[key]), decode_states(hooked, a[key]), atol=1e-4, rtol=0)
    # not vacuous: the states change from block to block
    assert (a[(0, "mlp")] - a[(3, "mlp")]).abs().max() > 1e-2


def test_necessity_sweep_agrees(twins):
    hooked, bridge = twins
    tokens = random_tokens(24, 6, seed=12, values=6)
    answers = own_answers(hooked, tokens)
    a = necessity_sweep(hooked, tokens, answers, progress=False, n_boot=20)
    b = necessity_sweep(bridge, tokens, answers, progress=False, n_boot=20)
    assert [x.n_faithful for x in b.blocks] == [x.n_faithful for x in a.blocks]
    assert any(x.n_faithful < 24 for x in a.blocks)


def test_head_pruning_agrees(twins):
    hooked, bridge = twins
    tokens = random_tokens(32, 6, seed=13, values=5)
    answers = own_answers(hooked, tokens)
    fit = disjoint_fit_tokens(tokens)
    cache_h = iv.MeanCache.fit(hooked, fit, progress=False)
    cache_b = iv.MeanCache.fit(bridge, fit, progress=False)
    kw = dict(wait=0, transfer=2, progress=False, target=0.5)
    a = prune_heads(hooked, tokens, answers, cache=cache_h, **kw)
    b = prune_heads(bridge, tokens, answers, cache=cache_b, **kw)
    assert b.removal_order == a.removal_order
    assert [p.faithfulness for p in b.curve] == [p.faithfulness for p in a.curve]
    assert len({p.faithfulness for p in a.curve}) > 1  # removing heads matters


def test_load_model_picks_the_backend():
    assert type(iv.adapt(loading.load_model("arith-gpt2", backend="hooked"))) is iv.HookedAdapter
    assert type(iv.adapt(loading.load_model("arith-gpt2", backend="bridge"))) is iv.BridgeAdapter
    assert iv.resolve_backend(None) == "hooked"  # TransformerLens 3.x
    with pytest.raises(ValueError, match="backend='tl4' is not valid: choose one of 'hooked', 'bridge', 'nnsight'"):
        loading.load_model("arith-gpt2", backend="tl4")
