"""The nnsight backend against TransformerBridge on the zoo models (both wrap the same Hugging Face
checkpoint with its unembedding bias, without weight processing): equal logits, means and every
intervention to 1e-4 in float32 (plus 1e-4 relative; in float64 the peeks agree to 1e-9); peeking by per-block attention masks equals peeking by pattern edits;
several configurations in one trace equal one pass each; nnsight's serverless dry run of a remote
request (serialised, rebuilt with the project's modules hidden, run here) gives the same numbers."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import interventions as iv
from interventions.types import InterventionError

pytest.importorskip("nnsight", reason="nnsight is not installed: pip install 'af1-circuits[nnsight]'")
zoo = pytest.importorskip("circuits.zoo")

ATOL, RTOL = 1e-4, 1e-4  # float32 logits reach 34 here; the unchanged models differ by 4e-5 already
PROMPTS = ["42+20-15=", "11+22-13=", "120+31-50=", "7+81-9=", "42+22-15=", "11+20-50="]
NAMES = [n for n in ("arith-gpt2", "arith-llama") if n in zoo.available()]


@pytest.fixture(scope="module", params=NAMES or [pytest.param(None, marks=pytest.mark.skip(reason="no zoo models"))])
def pair(request):
    """``(bridge, nnsight model, tokens, means on the bridge, means on nnsight)`` of one zoo model."""
    bridge, nn = zoo.load(request.param, backend="bridge"), zoo.load(request.param, backend="nnsight")
    tokens = nn.to_tokens(PROMPTS)
    assert torch.equal(bridge.to_tokens(PROMPTS), tokens)
    with torch.inference_mode():
        means = iv.MeanCache.fit(bridge, tokens, progress=False), iv.MeanCache.fit(nn, tokens, progress=False)
    return bridge, nn, tokens, *means


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.float(), b.float(), atol=ATOL, rtol=RTOL)


def test_adapter_and_capabilities(pair):
    _, nn, *_ = pair
    ad = iv.adapt(nn)
    assert ad.backend == "nnsight" and ad.edit_problems == {}
    assert ad.capabilities.configs_per_pass and ad.capabilities.attention_masks and not ad.capabilities.skips_blocks
    assert ad.info.n_layers == nn.cfg.n_layers == 6 and ad.info.n_heads == nn.cfg.n_heads


def test_logits_and_means_equal_the_bridge(pair):
    bridge, nn, tokens, cb, cn = pair
    with torch.inference_mode():
        close(nn(tokens), bridge(tokens))
    for name in ("cond_mean", "pos_mean", "z_mean"):
        close(getattr(cn, name), getattr(cb, name))
    assert cn.model_signature == cb.model_signature  # same shapes and the same embedding fingerprint


def interventions_of(n_layers: int, cache: iv.MeanCache) -> dict[str, list[iv.Intervention]]:
    return {
        "mean": [iv.MeanAblation(cache, layer=2)],
        "zero": [iv.ZeroAblation(layer=1, positions=(1, 3))],
        "heads zero": [iv.HeadAblation([(0, 1), (3, 0), (3, 2)])],
        "heads mean": [iv.HeadAblation([(1, 1), (4, 3)], method="mean", cache=cache)],
        "peek self all": [iv.Peek([0, 2, 5], mode="self", queries="all")],
        "peek self last": [iv.Peek([1, 4], mode="self", queries="last")],
        "peek no bos": [iv.Peek([2, 3], mode="self", queries="others", keep_bos=False)],
        "peek full": [iv.Peek([3], mode="full", queries="last")],
        **{f"af1 {w} {t}": iv.af1_subgraph(n_layers, w, t, cache) for w, t in ((-1, 0), (0, 2), (2, 1), (5, 0))},
    }


def test_every_intervention_equals_the_bridge(pair):
    bridge, nn, tokens, cb, cn = pair
    L = nn.cfg.n_layers
    on_bridge, on_nn = interventions_of(L, cb), interventions_of(L, cn)
    with torch.inference_mode():
        plain = nn(tokens)
        for label in on_bridge:
            out = iv.run(nn, tokens, on_nn[label])
            close(out, iv.run(bridge, tokens, on_bridge[label]))
            if label != "peek full":
                assert (out - plain).abs().max() > 1e-3, label  # the intervention changes the numbers
        for wait in range(L):
            close(iv.run(nn, tokens, [iv.CAMA(cn, layer=wait)]), iv.run(bridge, tokens, [iv.CAMA(cb, layer=wait)]))


def test_peek_masks_equal_pattern_edits(pair):
    """The mask form (nnsight: attention gets a per-block mask) equals the pattern edit (bridge) for every
    mode, query set and BOS choice, and both equal softmax restricted to ``Peek.allowed``. In float64 GPT-2
    agrees to 1e-9 (measured 1.4e-13): the two forms are the same computation. Hugging Face's Llama
    attention takes its softmax in float32 whatever the model's dtype, so there float64 still shows
    float32 rounding (2e-5), and the bound is 1e-4. In float32 the forms differ by rounding (up to 1.5e-4
    on logits of 34, where the unchanged GPT-2 models already differ by 4e-5)."""
    bridge, nn, tokens, *_ = pair
    name = nn.cfg.model_name
    bridge64, nn64 = zoo.load(name, backend="bridge").to(torch.float64), zoo.load(name, backend="nnsight")
    nn64.hf.to(torch.float64)
    n = tokens.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    with torch.inference_mode():
        tol64 = 1e-4 if nn.cfg.original_architecture == "LlamaForCausalLM" else 1e-9
        for mode in ("self", "full"):
            for queries in ("last", "others", "all"):
                for keep_bos in (True, False):
                    peek = iv.Peek([1, 3], mode=mode, queries=queries, keep_bos=keep_bos)
                    assert torch.equal(peek.allowed(n), iv.allowed_keys(n, mode, queries, keep_bos))
                    (name0, body), (name1, _) = peek.mask_hooks(iv.adapt(nn).info)
                    assert (name0, name1) == ("blocks.1.attn.hook_attn_mask", "blocks.3.attn.hook_attn_mask")
                    assert torch.equal(body(causal), peek.allowed(n))
                    out = iv.run(nn64, tokens, [peek])
                    assert out.dtype == torch.float64
                    torch.testing.assert_close(out, iv.run(bridge64, tokens, [peek]), atol=tol64, rtol=0)
                    close(iv.run(nn, tokens, [peek]), iv.run(bridge, tokens, [peek]))


def test_configurations_in_one_trace_equal_one_pass_each(pair):
    _, nn, tokens, _, cn = pair
    L = nn.cfg.n_layers
    runs = [(tokens[:4], iv.af1_subgraph(L, w, t, cn)) for w, t in ((1, 0), (1, 3), (3, 2), (-1, 4))]
    runs.append((tokens[4:], [iv.HeadAblation([(2, 1)])]))
    before = nn.usage.requests
    with torch.inference_mode():
        together = iv.run_many(nn, runs)
        assert nn.usage.requests == before + 1  # one trace (one request remotely) for five configurations
        for (toks, ivs), out in zip(runs, together):
            assert out.shape == (toks.shape[0], 1, nn.cfg.d_vocab)
            close(out, iv.run(nn, toks, ivs)[:, -1:])


def test_head_peek_masks_equal_pattern_edits(pair):
    """A head-level peek is a ``[n_heads, query, key]`` mask on nnsight (the chosen heads' rows restricted, the
    others causal) and equals the bridge's per-head pattern edit, alone and in one ``run_many`` beside a
    whole-block peek and no intervention (then each run has a trace of its own: a trace joins its invokes'
    masks, which must have one shape)."""
    bridge, nn, tokens, *_ = pair
    n, n_heads = tokens.shape[1], nn.cfg.n_heads
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    peeks = [iv.Peek([1, 3], "self", "last", heads=(0, 2)), iv.Peek([], "self", "all", heads={2: (1,), 4: (0, 3)})]
    for peek in peeks:
        for layer, (name, body) in zip(peek.layers, peek.mask_hooks(iv.adapt(nn).info)):
            mask = body(causal)
            assert name == f"blocks.{layer}.attn.hook_attn_mask" and mask.shape == (n_heads, n, n)
            for h in range(n_heads):
                assert torch.equal(mask[h], peek.allowed(n) if h in peek.heads_of(layer) else causal)
    with torch.inference_mode():
        plain = nn(tokens)
        for peek in peeks:
            out = iv.run(nn, tokens, [peek])
            close(out, iv.run(bridge, tokens, [peek]))
            whole = iv.run(nn, tokens, [iv.Peek(peek.layers, peek.mode, peek.queries)])
            assert (out - plain).abs().max() > 1e-3 and (out - whole).abs().max() > 1e-3
        runs = [(tokens[:3], [peeks[0]]), (tokens[:3], [iv.Peek([1, 3], "self", "last")]), (tokens[3:], [peeks[1]]),
                (tokens[3:], [])]
        before = nn.usage.requests
        together = iv.run_many(nn, runs)
        assert nn.usage.requests == before + len(runs)
        for (toks, ivs), out in zip(runs, together):
            close(out, iv.run(bridge, toks, ivs)[:, -1:] if ivs else bridge(toks)[:, -1:])


def test_run_from_replaces_the_residual(pair):
    bridge, nn, tokens, *_ = pair
    ad, ref = iv.adapt(nn), iv.adapt(bridge)
    with torch.inference_mode():
        for start in (0, 3, 6):
            resid = ref.run_to_resid(tokens) if start == 6 else ref.activations(tokens, [f"blocks.{start}.hook_resid_pre"])[f"blocks.{start}.hook_resid_pre"]
            close(ad.run_from(resid, start), ref.run_from(resid, start))
        close(ad.run_from(ad.embed(tokens), 0, 4), ref.run_from(ref.embed(tokens), 0, 4))


def test_unknown_hook_is_refused(pair):
    _, nn, tokens, *_ = pair
    with pytest.raises(InterventionError, match="hook point 'blocks.0.attn.hook_pattern' does not exist"):
        with iv.adapt(nn).hooks([("blocks.0.attn.hook_pattern", lambda a, hook=None: None)]):
            pass


def test_remote_dry_run_serialises_and_gives_the_same_numbers(pair):
    """``remote="local"``: nnsight serialises the request exactly as for NDIF, rebuilds it with the project's
    modules hidden (as on a server without them) and runs it here; nothing is sent anywhere."""
    _, nn, tokens, _, cn = pair
    L = nn.cfg.n_layers
    runs = [(tokens, iv.af1_subgraph(L, w, 1, cn)) for w in (0, 2)]
    runs += [(tokens, ivs) for ivs in interventions_of(L, cn).values()]  # every intervention travels
    with torch.inference_mode():
        local = iv.run_many(nn, runs)
        plain = nn(tokens)
        nn.remote = "local"
        try:
            remote = iv.run_many(nn, runs)
            fired = iv.run(nn, tokens, [iv.CAMA(cn, layer=1)])  # the fired check holds for hooks run "remotely"
            acts = iv.adapt(nn).activations(tokens, ["blocks.2.hook_resid_post"])
        finally:
            nn.remote = False
        for a, b in zip(remote, local):
            close(a, b)
        close(fired, iv.run(nn, tokens, [iv.CAMA(cn, layer=1)]))
        assert (fired - plain).abs().max() > 1e-3
        close(acts["blocks.2.hook_resid_post"], iv.adapt(nn).activations(tokens, ["blocks.2.hook_resid_post"])["blocks.2.hook_resid_post"])


def test_importing_interventions_does_not_import_nnsight():
    code = "import sys, interventions, circuits.models.loading; print('nnsight' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_nnsight_names_the_extra(monkeypatch):
    from interventions.backends.nnsight import require_nnsight

    monkeypatch.setitem(sys.modules, "nnsight", None)
    with pytest.raises(ImportError, match=r"^the nnsight backend needs the nnsight package: pip install "
                                          r"'af1-circuits\[nnsight\]'$"):
        require_nnsight()


def test_early_decoding_equals_the_bridge(pair):
    """The lens reads hook_resid_mid / hook_attn_out and decodes with model.ln_final and model.unembed."""
    from circuits.lens import early_decode

    bridge, nn, tokens, *_ = pair
    with torch.inference_mode():
        answers = bridge(tokens)[:, -1].argmax(-1)
    a = early_decode(nn, tokens, answers=answers, progress=False)
    b = early_decode(bridge, tokens, answers=answers, progress=False)
    assert (a.answer_rank == b.answer_rank).all()
    close(torch.as_tensor(a.answer_prob), torch.as_tensor(b.answer_prob))


def test_answer_readout_gives_the_metrics_of_the_logits(pair):
    """A remote search downloads four numbers per prompt (interventions.readout) instead of the logits; the
    metrics they give equal those of the full logits, on nnsight (computed in the trace) and on the bridge
    (computed here from its logits by run_many's fallback)."""
    from circuits.faithfulness import last_token_metrics
    from interventions.readout import readout_metrics

    bridge, nn, tokens, cb, cn = pair
    L = nn.cfg.n_layers
    with torch.inference_mode():
        answers = nn(tokens)[:, -1].argmax(-1)
        runs_nn = [(tokens, iv.af1_subgraph(L, w, t, cn)) for w, t in ((2, 0), (0, 3))]
        runs_b = [(tokens, iv.af1_subgraph(L, w, t, cb)) for w, t in ((2, 0), (0, 3))]
        for i, (out_nn, out_b) in enumerate(zip(iv.run_many(nn, runs_nn, logits="answer", answers=[answers] * 2),
                                                iv.run_many(bridge, runs_b, logits="answer", answers=[answers] * 2))):
            assert out_nn.shape == (len(tokens), 4)
            full = iv.run(nn, tokens, runs_nn[i][1])[:, -1]
            for a, b in zip(readout_metrics(out_nn, answers), last_token_metrics(full, answers)):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
            close(out_nn, out_b)
    with pytest.raises(InterventionError, match="needs answers"):
        iv.run_many(nn, runs_nn, logits="answer")


def test_flash_attention_refuses_masks(pair):
    _, nn, tokens, *_ = pair
    impl, nn.cfg.attn_implementation = nn.cfg.attn_implementation, "flash_attention_2"
    try:
        with pytest.raises(InterventionError, match="^Peek needs attention that takes a mask of allowed keys, but this "
                                                    "model runs flash_attention_2: load it with attn_implementation="):
            iv.run(nn, tokens, [iv.Peek([1])])
        iv.run(nn, tokens, [iv.ZeroAblation(1)])  # other interventions do not need masks
    finally:
        nn.cfg.attn_implementation = impl


@pytest.mark.skipif("arith-gpt2" not in zoo.available(), reason="the zoo model arith-gpt2 is not installed")
def test_planted_mask_is_attached_as_attention_masks(tmp_path):
    """A folder whose zoo.json records a planted mask (arith-gpt2's weights with the former arith-gpt2-af1's
    spec) gets it as permanent attention-mask hooks on nnsight: the bridge's logits."""
    from tests.conftest import planted_mask_folder

    folder = planted_mask_folder(tmp_path)
    bridge, nn = zoo.load_dir(folder, backend="bridge"), zoo.load_dir(folder, backend="nnsight")
    tokens = nn.to_tokens(PROMPTS)
    with torch.inference_mode():  # the mask changes the logits: it is attached
        assert (nn(tokens) - zoo.load("arith-gpt2", backend="nnsight")(tokens)).abs().max() > 0.1
    assert all(p.permanent for name, p in nn.hook_dict.items() if name.endswith("hook_attn_mask"))
    with torch.inference_mode():
        close(nn(tokens), bridge(tokens))
        with iv.adapt(nn).hooks():  # scoped hooks come and go; the planted ones stay
            pass
        close(nn(tokens), bridge(tokens))
