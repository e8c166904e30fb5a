"""The nnsight backend against TransformerBridge on stand-in checkpoints of real architectures: GPT-2
(learned positions), Llama-3 (grouped-query attention: 4 query heads, 2 key-value heads), Qwen2 (no BOS
token, grouped-query attention) and Pythia (GPT-NeoX: parallel attention and MLP, partial rotary).

Both load the same checkpoint with ``circuits.models.loading.load_model``. The bridge runs in compatibility
mode (LayerNorm folded, writing weights and the unembedding centred), so its logits differ from the
checkpoint's by a constant per position and its residual stream by a constant per position and
feature: log-probabilities, faithfulness and search results are what must be equal, and are (to 1e-4
in float32). nnsight runs the checkpoint's own attention (SDPA): peeking there is the mask form.
"""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from circuits.faithfulness import faithfulness
from circuits.necessity import necessity_sweep
from circuits.search import configurations, search_af1
from circuits.search.cost import search_cost
from tests import standins
from tests.conftest import needs_hooked

pytest.importorskip("nnsight", reason="nnsight is not installed: pip install 'af1-circuits[nnsight]'")

KEYS = ("gpt2", "llama3", "qwen2", "pythia")
N = 24


def log_probs(x: torch.Tensor) -> torch.Tensor:
    return x.float().log_softmax(-1)


@pytest.fixture(scope="module", params=KEYS)
def pair(request, load_standin):
    """``(bridge, nnsight model, prompts)`` of one stand-in (answers: the model's own top-1 tokens)."""
    bridge, nn = load_standin(request.param, "bridge"), load_standin(request.param, "nnsight")
    p = standins.self_answered(bridge, "add", N, prepend_bos=True)
    return bridge, nn, p


def test_architecture_is_read_from_the_checkpoint(pair):
    bridge, nn, _ = pair
    assert iv.adapt(nn).backend == "nnsight"
    for field in ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_key_value_heads",
                  "positional_embedding_type", "default_prepend_bos"):
        assert getattr(nn.cfg, field) == getattr(bridge.cfg, field), field
    assert iv.adapt(nn).info.n_kv_heads == iv.adapt(bridge).info.n_kv_heads


def test_log_probs_and_every_intervention_equal_the_bridge(pair):
    bridge, nn, p = pair
    toks = p.tokens
    L = nn.cfg.n_layers
    with torch.inference_mode():
        cb, cn = iv.MeanCache.fit(bridge, toks, progress=False), iv.MeanCache.fit(nn, toks, progress=False)

        def both(make):
            a, b = iv.run(nn, toks, make(cn)), iv.run(bridge, toks, make(cb))
            torch.testing.assert_close(log_probs(a), log_probs(b), atol=1e-4, rtol=0)
            return a

        plain = nn(toks)
        torch.testing.assert_close(log_probs(plain), log_probs(bridge(toks)), atol=1e-4, rtol=0)
        changed = [
            both(lambda c: [iv.HeadAblation([(0, 1), (1, 3)])]),
            both(lambda c: [iv.HeadAblation([(0, 0), (1, 2)], method="mean", cache=c)]),
            both(lambda c: [iv.MeanAblation(c, layer=0)]),
            both(lambda c: [iv.ZeroAblation(layer=0)]),
            both(lambda c: [iv.Peek([0, 1], mode="self", queries="all")]),
            both(lambda c: [iv.Peek([1], mode="self", queries="last", keep_bos=False)]),
        ]
        changed += [both(lambda c, w=w, t=t: iv.af1_subgraph(L, w, t, c)) for w, t in configurations(L)]
    assert all((x - plain).abs().max() > 1e-3 for x in changed)


def test_faithfulness_and_necessity_equal_the_bridge(pair):
    bridge, nn, p = pair
    L = nn.cfg.n_layers
    for ivs in ([iv.Peek([1], mode="self", queries="all")], [iv.HeadAblation([(1, 0), (1, 1)])],
                iv.af1_subgraph(L, 0, 0, ablation="zero")):
        a = faithfulness(nn, p.tokens, p.answers, ivs, n_boot=20)
        b = faithfulness(bridge, p.tokens, p.answers, ivs, n_boot=20)
        assert (a.n, a.n_faithful) == (b.n, b.n_faithful) and a.n == N
        assert a.mean_answer_prob == pytest.approx(b.mean_answer_prob, abs=1e-4)
        assert a.mean_logit_diff == pytest.approx(b.mean_logit_diff, abs=1e-4)
    na = necessity_sweep(nn, p.tokens, p.answers, progress=False, n_boot=20)
    nb = necessity_sweep(bridge, p.tokens, p.answers, progress=False, n_boot=20)
    assert [(x.layer, x.faithfulness, x.ci_low, x.ci_high) for x in na.blocks] == \
           [(x.layer, x.faithfulness, x.ci_low, x.ci_high) for x in nb.blocks]


def test_search_equals_the_bridge_and_costs_what_was_estimated(pair):
    """The full-grid search on nnsight (several configurations per trace, chosen by capability) gives the
    bridge's fast search's results; its requests are exactly :func:`search_cost`'s estimate."""
    bridge, nn, p = pair
    L = nn.cfg.n_layers
    before = nn.usage.requests, nn.usage.tokens
    a = search_af1(nn, p.tokens, p.answers, fit=p.fit, grid="full", progress=False, n_boot=20, configs_per_pass=2)
    used = nn.usage.requests - before[0], nn.usage.tokens - before[1]
    b = search_af1(bridge, p.tokens, p.answers, fit=p.fit, grid="full", progress=False, n_boot=20)
    rows = lambda r: {c.config: (c.n_faithful, c.ci_low, c.ci_high) for c in r.results}  # noqa: E731
    assert rows(a) == rows(b) and sorted(rows(a)) == sorted(configurations(L))
    for x, y in zip(a.results, b.results):
        assert x.mean_answer_prob == pytest.approx(y.mean_answer_prob, abs=1e-4)
    assert (a.selected is None) == (b.selected is None)
    if a.selected is not None:
        assert a.selected.config == b.selected.config
    cost = search_cost(L, N, int(p.tokens.shape[1]), batch_size=128, configs_per_pass=2, n_fit=len(p.fit))
    assert a.passes == cost.search_requests
    assert used == (cost.requests, cost.tokens)
    auto = search_af1(nn, p.tokens, p.answers, fit=p.fit, grid="auto", progress=False, n_boot=20)
    assert (auto.selected and auto.selected.config) == (a.selected and a.selected.config)


def test_masks_of_several_invokes_stay_in_their_rows(pair):
    """SDPA attention gets no mask of its own; invokes with and without peeks in one trace each get theirs."""
    _, nn, p = pair
    t = p.tokens
    runs = [(t[:5], []), (t[5:12], [iv.Peek([0, 1], "self", "all")]), (t[12:13], [iv.ZeroAblation(0)]),
            (t[13:], [iv.Peek([1], "self", "last", keep_bos=False), iv.HeadAblation([(0, 2)])])]
    with torch.inference_mode():
        together = iv.run_many(nn, runs, logits="all")
        for (toks, ivs), out in zip(runs, together):
            alone = iv.run(nn, toks, ivs) if ivs else nn(toks)
            torch.testing.assert_close(out, alone, atol=1e-5, rtol=0)


def test_early_decoding_equals_the_bridge(pair):
    """Decoded through the final norm, the compatibility-mode bridge's centred residual gives the same
    probabilities (also for Pythia's parallel blocks: post-attention = resid_pre + attn_out)."""
    from circuits.lens import early_decode

    bridge, nn, p = pair
    a = early_decode(nn, p.tokens, answers=p.answers, progress=False)
    b = early_decode(bridge, p.tokens, answers=p.answers, progress=False)
    assert (a.answer_rank == b.answer_rank).all()
    assert a.answer_prob == pytest.approx(b.answer_prob, abs=1e-4)


@needs_hooked
def test_gptj_peeks_on_nnsight_as_on_hooked_transformer(load_standin):
    """The bridge around Hugging Face's GPT-J attention cannot peek (it ignores pattern edits); nnsight gives
    that attention a mask, with HookedTransformer's (pattern-edit) numbers."""
    hooked, nn = load_standin("gptj", "hooked"), load_standin("gptj", "nnsight")
    p = standins.self_answered(hooked, "add", N, prepend_bos=True)
    L = nn.cfg.n_layers
    with torch.inference_mode():
        ch, cn = iv.MeanCache.fit(hooked, p.tokens, progress=False), iv.MeanCache.fit(nn, p.tokens, progress=False)
        for w, t in configurations(L):
            a, b = iv.run(nn, p.tokens, iv.af1_subgraph(L, w, t, cn)), iv.run(hooked, p.tokens, iv.af1_subgraph(L, w, t, ch))
            torch.testing.assert_close(log_probs(a), log_probs(b), atol=1e-4, rtol=0)
        peeked = iv.run(nn, p.tokens, [iv.Peek([0, 1], "self", "all")])
        assert (log_probs(peeked) - log_probs(nn(p.tokens))).abs().max() > 1e-3


@pytest.mark.parametrize("key, message", [("pythia", "in sequence"), ("gemma", "not a plain LayerNorm or RMSNorm")])
def test_edges_refuse_blocks_the_split_emulation_does_not_cover(load_standin, key, message):
    """Parallel attention and MLP (Pythia) and Gemma's ``1 + weight`` RMSNorm (caught by the copy's check on
    random input, not by its class name) are refused in one line; the model runs on as before."""
    nn = load_standin(key, "nnsight")
    with pytest.raises(iv.InterventionError, match=message) as err:
        nn.set_use_split_qkv_input(True)
    assert "\n" not in str(err.value) and "--backend bridge" in str(err.value)
    assert not nn.cfg.use_split_qkv_input and nn.split() is None


@pytest.mark.parametrize("key", ["llama3", "qwen2"])
def test_edge_pass_on_nnsight_reproduces_the_checkpoint(load_standin, key):
    """Real Llama-3 and Qwen2 blocks (rotary, grouped-query attention, q/k/v biases on Qwen2): the edge pass with
    split inputs gives the checkpoint's own metric, and removing every edge with the clean outputs as the
    counterfactual changes nothing."""
    from circuits.edges.analysis import layout_of
    from circuits.edges.engine import edge_pass, logit_diff

    nn = load_standin(key, "nnsight")
    p = standins.self_answered(nn, "add", 8, prepend_bos=True)
    ad = iv.adapt(nn)
    layout = layout_of(ad.info, int(p.tokens.shape[1]), 1, True)
    with torch.no_grad():
        want = logit_diff(nn(p.tokens)[:, -1], p.answers)
    clean = edge_pass(ad, layout, p.tokens, p.answers)
    torch.testing.assert_close(clean.metric, want, atol=1e-4, rtol=1e-4)
    same = edge_pass(ad, layout, p.tokens, p.answers, counter=clean.outputs, removal=1.0)
    torch.testing.assert_close(same.metric, want, atol=1e-4, rtol=1e-4)
    zero = edge_pass(ad, layout, p.tokens, p.answers, counter=torch.zeros_like(clean.outputs), removal=1.0)
    assert (zero.metric - want).abs().max() > 1e-2
