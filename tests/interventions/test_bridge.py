"""The TransformerBridge backend: adapter, conversion from HookedTransformer weights, agreement of the
two backends, and the check that refuses edits a backend would silently discard.

Runs under transformer-lens 3.9 (both backends, cross-checked) and 4.x (bridge only; the 3.9
numbers then come from the fixtures in ``fixtures/tl39``, written by ``make_reference.py``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import interventions as iv
from interventions.adapter import edit_kind
from tests.conftest import (
    ARCHS,
    BACKENDS,
    N_LAYERS,
    build_bridge,
    build_hooked,
    build_model,
    hooked_state,
    needs_hooked,
    random_tokens,
)
from tests.interventions.hf_models import build_hf_bridge
from tests.interventions.reference import peek_allowed, without_heads

FIXTURES = Path(__file__).parent / "fixtures" / "tl39"
VALUES = 6


# ----------------------------------------------------------------------------- adapter on the suite's models
def test_adapter_reports_shapes_and_backend(model, arch, backend):
    ad = iv.adapt(model)
    assert type(ad) is (iv.BridgeAdapter if backend == "bridge" else iv.HookedAdapter)
    assert ad.info.backend == backend
    assert (ad.info.n_layers, ad.info.n_heads, ad.info.d_head, ad.info.d_model, ad.info.d_vocab) == (4, 4, 8, 32, 40)
    assert ad.info.n_kv_heads == (2 if arch == "llama" else 4)
    assert ad.info.parallel_attn_mlp == (arch in ("neox", "gptj"))
    assert ad.edit_problems == {}
    assert ad.embedding_matrix() is model.W_E


def test_run_to_resid_is_the_last_residual(model):
    tokens = random_tokens(3, 6, seed=50)
    _, acts = model.run_with_cache(tokens, names_filter=f"blocks.{N_LAYERS - 1}.hook_resid_post")
    resid = iv.adapt(model).run_to_resid(tokens)
    assert resid.shape == (3, 6, 32)
    torch.testing.assert_close(resid, acts[f"blocks.{N_LAYERS - 1}.hook_resid_post"], atol=1e-6, rtol=0)


def test_embed_and_run_from_reproduce_the_full_pass(model):
    """``embed`` is the residual entering block 0; ``run_from(resid, start, stop)`` continued from the
    cached residual entering ``start`` gives the cached residual entering ``stop``, or the logits."""
    tokens = random_tokens(3, 6, seed=52)
    logits, acts = model.run_with_cache(tokens)
    ad = iv.adapt(model)

    def entering(k):
        return acts[f"blocks.{k}.hook_resid_pre"] if k < N_LAYERS else acts[f"blocks.{N_LAYERS - 1}.hook_resid_post"]

    torch.testing.assert_close(ad.embed(tokens), entering(0), atol=1e-6, rtol=0)
    for start in range(N_LAYERS + 1):
        torch.testing.assert_close(ad.run_from(entering(start), start), logits, atol=1e-5, rtol=0)
        for stop in range(start + 1, N_LAYERS + 1):
            torch.testing.assert_close(ad.run_from(entering(start), start, stop), entering(stop), atol=1e-5, rtol=0)
    # not a pass-through: a different residual entering block 2 gives different logits
    assert (ad.run_from(entering(1), 2) - logits).abs().max() > 1e-2
    with pytest.raises(ValueError, match=r"stop=2 must satisfy start < stop <= 4 \(start=2\)"):
        ad.run_from(entering(2), 2, 2)
    with pytest.raises(ValueError, match=r"start=5 is outside 0\.\.4"):
        ad.run_from(entering(2), 5)


def test_run_from_fires_the_hooks_of_the_blocks_it_runs(model):
    """An intervention in a block after ``start`` takes effect; one before it never fires."""
    tokens = random_tokens(3, 6, seed=53)
    _, acts = model.run_with_cache(tokens, names_filter="blocks.2.hook_resid_pre")
    ad = iv.adapt(model)
    plain = ad.run_from(acts["blocks.2.hook_resid_pre"], 2)
    with iv.apply(model, [iv.Peek([3], mode="self", queries="all")]):
        peeked = ad.run_from(acts["blocks.2.hook_resid_pre"], 2)
    assert (peeked - plain).abs().max() > 1e-3
    # a hook on the residual entering ``start`` sees (and edits) the given residual, as in a full pass
    ad.add_hook("blocks.2.hook_resid_pre", lambda a, hook=None: torch.zeros_like(a), level=99)
    try:
        zeroed = ad.run_from(acts["blocks.2.hook_resid_pre"], 2)
    finally:
        ad.remove_hooks(["blocks.2.hook_resid_pre"], level=99)
    torch.testing.assert_close(zeroed, ad.run_from(torch.zeros_like(acts["blocks.2.hook_resid_pre"]), 2))


def test_token_module_sees_the_token_ids(model):
    tokens = random_tokens(2, 5, seed=51)
    seen = []
    handle = iv.adapt(model).token_module().register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model(tokens)
    finally:
        handle.remove()
    assert len(seen) == 1 and torch.equal(seen[0], tokens)


# ----------------------------------------------------------------------------- both backends agree
@needs_hooked
def test_hooked_state_reproduces_hooked_initialisation(arch):
    """The bridge of the suite gets HookedTransformer's own initial weights (also where 3.x is absent)."""
    for kwargs in ({}, {"seed": 123}, {"n_layers": 5}):
        ref = build_hooked(arch, **kwargs).state_dict()
        _, state = hooked_state(arch, **kwargs)
        assert set(state) == {k for k in ref if not k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos"))}
        for name, tensor in state.items():
            assert torch.equal(tensor, ref[name]), name


@needs_hooked
def test_backends_agree_on_logits_and_activations(arch):
    hooked, bridge = build_hooked(arch), build_bridge(arch)
    tokens = random_tokens(4, 9, seed=52)
    names = [f"blocks.{l}.{h}" for l in (0, 3) for h in ("hook_resid_post", "attn.hook_pattern", "attn.hook_z")]
    with torch.no_grad():
        ref, ref_acts = hooked.run_with_cache(tokens, names_filter=names)
        got, got_acts = bridge.run_with_cache(tokens, names_filter=names)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    for name in names:
        torch.testing.assert_close(got_acts[name], ref_acts[name], atol=1e-4, rtol=0, msg=name)
    assert iv.adapt(bridge).fingerprint() == iv.adapt(hooked).fingerprint()


@needs_hooked
def test_backends_agree_on_interventions(arch):
    """CAMA, Peek, HeadAblation and the AF1 subgraph give the same logits on both backends; a cache
    fitted on one backend is the cache of the other (and is accepted by it)."""
    hooked, bridge = build_hooked(arch), build_bridge(arch)
    fit = random_tokens(150, 6, seed=53, values=VALUES)
    tokens = random_tokens(6, 6, seed=54, values=VALUES)
    cache = iv.MeanCache.fit(hooked, fit, progress=False)
    other = iv.MeanCache.fit(bridge, fit, progress=False)
    for name in ("cond_mean", "pos_mean", "z_mean"):
        torch.testing.assert_close(getattr(other, name), getattr(cache, name), atol=1e-4, rtol=0)
    plain = hooked(tokens)
    cases = [
        [iv.CAMA(cache, layer=1)],
        [iv.Peek([0, 2], "self", "all")],
        [iv.Peek([1], "self", "last", keep_bos=False)],
        [iv.HeadAblation([(0, 1), (2, 3)])],
        [iv.HeadAblation([(1, 0), (3, 2)], "mean", cache)],
        iv.af1_subgraph(N_LAYERS, 0, 2, cache),
        iv.af1_subgraph(N_LAYERS, 1, 1, cache, ablation="mean"),
    ]
    for ivs in cases:
        ref = iv.run(hooked, tokens, ivs)
        got = iv.run(bridge, tokens, ivs)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0, msg=repr(ivs))
        assert (ref - plain).abs().max() > 1e-3, f"{ivs!r} must change the logits"


def test_grouped_query_attention_is_per_query_head_on_every_backend():
    """Llama with 4 query heads sharing 2 key/value heads: head ablation and peeking address query
    heads (the pattern and hook_z have 4 heads) on each backend, with the same numbers."""
    tokens = random_tokens(3, 7, seed=55)
    allowed = peek_allowed(7, "self", "all")
    results = {}
    for backend in BACKENDS:
        model = build_model("llama", backend)
        _, acts = model.run_with_cache(tokens, names_filter=["blocks.1.attn.hook_z", "blocks.1.attn.hook_pattern"])
        assert acts["blocks.1.attn.hook_z"].shape == (3, 7, 4, 8)
        assert acts["blocks.1.attn.hook_pattern"].shape == (3, 4, 7, 7)
        a = iv.run(model, tokens, [iv.HeadAblation([(1, 0)])])
        b = iv.run(model, tokens, [iv.HeadAblation([(1, 1)])])  # shares its key/value head with head 0
        assert (a - b).abs().max() > 1e-3
        torch.testing.assert_close(b, without_heads(model, [(1, 1)])(tokens), atol=1e-5, rtol=1e-5)
        seen = []
        with iv.apply(model, [iv.Peek([1], "self", "all")]):
            model.hook_dict["blocks.1.attn.hook_pattern"].add_hook(lambda p, hook: seen.append(p.clone()))
            try:
                peeked = model(tokens)
            finally:
                model.hook_dict["blocks.1.attn.hook_pattern"].remove_hooks("fwd")
        if backend == "bridge" and not seen:  # pragma: no cover - a backend that reports no pattern
            pytest.fail("the bridge did not report the attention pattern")
        # Every query head, also the two sharing one key/value head, sees only BOS and itself.
        assert torch.all(seen[0][:, :, ~allowed] == 0) and seen[0].shape[1] == 4
        results[backend] = (a, b, peeked)
    if len(results) == 2:
        for got, ref in zip(results["bridge"], results["hooked"]):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- 3.9 fixtures (conversion)
@pytest.mark.parametrize("name", ARCHS)
def test_conversion_matches_tl39_fixture(name):
    """Fixtures hold 3.9 models with every parameter perturbed (biases, norm weights, b_U non-zero)."""
    from safetensors.torch import load_file

    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    ref = load_file(str(FIXTURES / f"{name}_ref.safetensors"))
    bridge = iv.bridge_from_hooked_state(meta["cfg"], load_file(str(FIXTURES / f"{name}.safetensors")))
    with torch.no_grad():
        logits, acts = bridge.run_with_cache(ref["tokens"])
    torch.testing.assert_close(logits, ref["logits"], atol=1e-4, rtol=0)
    for key in ref:
        if key.startswith("blocks."):
            torch.testing.assert_close(acts[key], ref[key], atol=1e-4, rtol=0, msg=key)
    assert bridge.cfg.n_key_value_heads == meta["cfg"].get("n_key_value_heads")


@pytest.mark.parametrize("name", ARCHS)
def test_compatibility_mode_matches_tl39_from_pretrained_processing(name):
    """enable_compatibility_mode() gives the numbers of 3.9's processed weights (from_pretrained:
    fold_ln, centring, folded value biases); without it the logits differ, and the interventions
    still run on the processed bridge."""
    from safetensors.torch import load_file

    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    ref = load_file(str(FIXTURES / f"{name}_ref.safetensors"))
    processed = load_file(str(FIXTURES / f"{name}_processed.safetensors"))
    bridge = iv.bridge_from_hooked_state(meta["cfg"], load_file(str(FIXTURES / f"{name}.safetensors")))
    assert (processed["logits"] - ref["logits"]).abs().max() > 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge.enable_compatibility_mode(disable_warnings=True)
    with torch.no_grad():
        logits, acts = bridge.run_with_cache(ref["tokens"])
    torch.testing.assert_close(logits, processed["logits"], atol=1e-4, rtol=0)
    for key in ("blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"):
        torch.testing.assert_close(acts[key], processed[key], atol=1e-4, rtol=0, msg=key)
    assert iv.adapt(bridge).edit_problems == {}
    peeked = iv.run(bridge, ref["tokens"], [iv.Peek([0, 1], "self")])
    assert (peeked - logits).abs().max() > 1e-3


def test_conversion_keeps_a_tokenizer_without_bos_post_processor():
    from safetensors.torch import load_file

    from interventions.tokenization import make_word_tokenizer

    meta = json.loads((FIXTURES / "gpt2.json").read_text())
    tok = make_word_tokenizer(50, add_bos=False)
    bridge = iv.bridge_from_hooked_state(meta["cfg"], load_file(str(FIXTURES / "gpt2.safetensors")), tokenizer=tok)
    assert bridge.to_tokens("w1 w2").tolist() == [[0, 3, 4]]
    assert bridge.to_tokens("w1 w2", prepend_bos=False).tolist() == [[3, 4]]


def test_conversion_rejects_unsupported_configs():
    cfg, state = hooked_state("gpt2")
    with pytest.raises(NotImplementedError, match="attn_only"):
        iv.bridge_from_hooked_state({**cfg, "attn_only": True}, state)
    with pytest.raises(NotImplementedError, match="sequential LayerNorm"):
        iv.bridge_from_hooked_state({**cfg, "positional_embedding_type": "rotary"}, state)


# ----------------------------------------------------------------------------- discarded edits are refused
@pytest.fixture(scope="module")
def hf_gptj():
    return build_hf_bridge("gptj")


def test_hf_gptj_pattern_edits_are_refused_not_dropped(hf_gptj):
    """The bridge of Hugging Face GPT-J only observes attn.hook_pattern: Peek must raise, naming the
    model class and a way out, instead of returning the unchanged logits."""
    tokens = random_tokens(2, 6, d_vocab=50, seed=56)
    ad = iv.adapt(hf_gptj)
    assert set(ad.edit_problems) == {"pattern"}
    with pytest.raises(iv.InterventionError, match=r"GPTJForCausalLM.*attn\.hook_pattern.*Peek") as err:
        iv.run(hf_gptj, tokens, [iv.Peek([0], "self")])
    assert "bridge_from_hooked_state" in str(err.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the backend's own "edit is discarded" warning must not be reached
        plain = hf_gptj(tokens)
        iv.run(hf_gptj, tokens, [iv.Peek([0, 1], "full")])  # read-only at the pattern: allowed
    # Edits at hook_z and hook_resid_post do reach the logits on this model.
    assert (iv.run(hf_gptj, tokens, [iv.HeadAblation([(1, 2)])]) - plain).abs().max() > 1e-4
    assert (iv.run(hf_gptj, tokens, [iv.ZeroAblation(layer=0)]) - plain).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ("gpt2", "neox", "llama"))
def test_hf_bridges_honour_every_checked_edit(arch):
    bridge = build_hf_bridge(arch, n_kv_heads=2 if arch == "llama" else None)
    assert iv.adapt(bridge).edit_problems == {}
    tokens = random_tokens(2, 6, d_vocab=50, seed=57)
    assert (iv.run(bridge, tokens, [iv.Peek([0, 1], "self")]) - bridge(tokens)).abs().max() > 1e-4


def test_check_fires_where_hook_points_ignore_edits(arch, backend, monkeypatch):
    """Make every block's hook_resid_post drop returned edits (as HF GPT-J does at hook_pattern): the
    probe of a fresh model notices, and an ablation there raises instead of leaving the logits as
    they were. Edits at other hook kinds keep working."""
    model = build_model(arch, backend)
    for layer in range(N_LAYERS):
        point = model.hook_dict[f"blocks.{layer}.hook_resid_post"]

        def add_hook_ignoring_edits(fn, *args, _original=point.add_hook, **kwargs):
            return _original(lambda act, hook: (fn(act, hook), None)[1], *args, **kwargs)

        monkeypatch.setattr(point, "add_hook", add_hook_ignoring_edits)
    tokens = random_tokens(2, 6, seed=58)
    plain = model(tokens)
    ad = iv.adapt(model)
    assert set(ad.edit_problems) == {"resid_post"}
    assert "blocks.{l}.hook_resid_post" in ad.edit_problems["resid_post"]
    with pytest.raises(iv.InterventionError, match="ignores edits.*CAMA"):
        iv.run(model, tokens, [iv.ZeroAblation(layer=1)])
    assert (iv.run(model, tokens, [iv.HeadAblation([(1, 0)])]) - plain).abs().max() > 1e-3
    monkeypatch.undo()
    torch.testing.assert_close(model(tokens), plain, atol=0, rtol=0)  # no hook left behind


def test_probe_runs_once_per_model_and_hides_user_hooks(arch, backend):
    model = build_model(arch, backend)
    calls = []
    model.hook_dict["blocks.0.hook_resid_post"].add_hook(lambda act, hook: calls.append(1))
    try:
        first = iv.adapt(model)
        assert calls == [], "the probe forward passes must not run the user's hooks"
        assert iv.adapt(model).edit_problems is first.edit_problems  # memoised
        model(random_tokens(1, 4))
        assert calls == [1], "the user's hook is back after the probe"
    finally:
        model.hook_dict["blocks.0.hook_resid_post"].remove_hooks("fwd")


def test_edit_kind_names():
    assert edit_kind("blocks.3.attn.hook_pattern") == "pattern"
    assert edit_kind("blocks.0.attn.hook_z") == "z"
    assert edit_kind("blocks.11.hook_resid_post") == "resid_post"
    assert edit_kind("blocks.0.attn.hook_attn_scores") is None
    assert edit_kind("blocks.0.hook_resid_pre") is None


def test_a_model_the_probe_cannot_run_gets_a_warning_not_an_error(monkeypatch):
    model = build_model("gpt2", BACKENDS[-1])

    def broken_forward(*args, **kwargs):
        raise RuntimeError("needs an attention mask")

    monkeypatch.setattr(model, "forward", broken_forward)
    with pytest.warns(RuntimeWarning, match="could not verify.*needs an attention mask"):
        assert iv.adapt(model).edit_problems == {}
    assert model.training is False


def test_bridge_from_hooked_refuses_what_is_not_a_hooked_transformer():
    bridge = build_bridge("gpt2")
    with pytest.raises(TypeError, match="already is a TransformerBridge, use it as it is"):
        iv.bridge_from_hooked(bridge)
    with pytest.raises(TypeError, match="needs a HookedTransformer, got Linear"):
        iv.bridge_from_hooked(torch.nn.Linear(2, 2))
