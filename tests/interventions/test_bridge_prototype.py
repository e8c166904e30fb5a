"""Checks of the transformer-lens 4.x (TransformerBridge) prototype backend.

Runs only where transformer-lens >= 4 is installed; skipped under 3.x.
The 3.9 reference fixtures in ``fixtures/tl39`` are produced by
``fixtures/tl39/make_reference.py`` (run with transformer-lens 3.x).
"""
from __future__ import annotations

import importlib.metadata
import json
import warnings
from pathlib import Path

import pytest
import torch

try:
    _TL_VERSION = importlib.metadata.version("transformer-lens")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover
    _TL_VERSION = "0"
if int(_TL_VERSION.split(".")[0]) < 4:
    pytest.skip(f"needs transformer-lens>=4 (found {_TL_VERSION})", allow_module_level=True)

from safetensors.torch import load_file  # noqa: E402

from interventions._bridge_prototype import (  # noqa: E402
    ARCHES,
    bridge_from_hooked_state,
    build_random_bridge,
    make_word_tokenizer,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tl39"
N_LAYERS, D_MODEL, N_HEADS, D_VOCAB = 2, 32, 4, 50
KV_HEADS = {"llama": 2}
_BRIDGES: dict = {}


def bridge(arch: str):
    if arch not in _BRIDGES:
        _BRIDGES[arch] = build_random_bridge(
            arch, n_layers=N_LAYERS, d_model=D_MODEL, n_heads=N_HEADS,
            n_kv_heads=KV_HEADS.get(arch), d_vocab=D_VOCAB, seed=0,
        )
    return _BRIDGES[arch]


def tokens():
    gen = torch.Generator().manual_seed(0)
    t = torch.randint(2, D_VOCAB, (2, 7), generator=gen)
    t[:, 0] = 0
    return t


def run(b, toks, hooks=()):
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = b.run_with_hooks(toks, fwd_hooks=list(hooks)) if hooks else b(toks)
    return out, [str(x.message) for x in w]


# ----------------------------------------------------------------- construction
@pytest.mark.parametrize("arch", ARCHES)
def test_random_bridge_api(arch):
    b = bridge(arch)
    d_head = D_MODEL // N_HEADS
    assert (b.cfg.n_layers, b.cfg.n_heads, b.cfg.d_model, b.cfg.d_head, b.cfg.d_vocab) == (
        N_LAYERS, N_HEADS, D_MODEL, d_head, D_VOCAB
    )
    assert b.cfg.n_key_value_heads == KV_HEADS.get(arch)
    assert b.cfg.parallel_attn_mlp == (arch in ("neox", "gptj"))
    toks = b.to_tokens("w1 w2 w3", prepend_bos=True)
    assert toks.tolist() == [[0, 3, 4, 5]]
    assert b.to_str_tokens(toks[0]) == ["<bos>", "w1", "w2", "w3"]
    assert b.to_string(toks[0, 1:]) == "w1 w2 w3"
    t = tokens()
    logits, cache = b.run_with_cache(t)
    assert logits.shape == (2, 7, D_VOCAB)
    assert b.W_U.shape == (D_MODEL, D_VOCAB)
    shapes = {
        "hook_embed": (2, 7, D_MODEL),
        "blocks.0.hook_resid_pre": (2, 7, D_MODEL),
        "blocks.0.hook_resid_post": (2, 7, D_MODEL),
        "blocks.0.attn.hook_pattern": (2, N_HEADS, 7, 7),
        "blocks.0.attn.hook_attn_scores": (2, N_HEADS, 7, 7),
        # query heads, also for grouped-query attention
        "blocks.0.attn.hook_z": (2, 7, N_HEADS, d_head),
        "blocks.0.attn.hook_k": (2, 7, KV_HEADS.get(arch, N_HEADS), d_head),
        "blocks.0.hook_attn_out": (2, 7, D_MODEL),
        "blocks.0.hook_mlp_out": (2, 7, D_MODEL),
        "ln_final.hook_normalized": (2, 7, D_MODEL),
    }
    if arch in ("gpt2", "llama"):  # sequential blocks only
        shapes["blocks.0.hook_resid_mid"] = (2, 7, D_MODEL)
    for name, shape in shapes.items():
        assert name in b.hook_dict, name
        assert tuple(cache[name].shape) == shape, name
    # hook_pattern is causal-masked already
    pat = cache["blocks.1.attn.hook_pattern"]
    assert torch.all(torch.triu(pat, diagonal=1) == 0)
    torch.testing.assert_close(pat.sum(-1), torch.ones_like(pat.sum(-1)))
    # stop_at_layer / start_at_layer
    with torch.no_grad():
        resid = b(t, stop_at_layer=1)
        torch.testing.assert_close(resid, cache["blocks.0.hook_resid_post"])
        torch.testing.assert_close(b(resid, start_at_layer=1), logits)


@pytest.mark.parametrize("arch", ARCHES)
def test_embed_receives_token_ids(arch):
    b = bridge(arch)
    seen = []
    h = b.embed.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        b(tokens())
    finally:
        h.remove()
    assert len(seen) == 1 and torch.equal(seen[0], tokens())


@pytest.mark.parametrize("arch", ARCHES)
def test_hook_dict_levels(arch):
    b = bridge(arch)
    t = tokens()
    base, _ = run(b, t)
    hp = b.hook_dict["blocks.1.hook_resid_post"]
    hp.add_hook(lambda x, hook: torch.zeros_like(x), dir="fwd", level=3)
    try:
        edited, _ = run(b, t)
    finally:
        hp.remove_hooks("fwd", level=3)
    after, _ = run(b, t)
    assert not torch.allclose(edited, base)
    torch.testing.assert_close(after, base)


# ----------------------------------------------------------------- hook edits
def _resid(x, hook):
    return x + torch.linspace(-1.0, 1.0, x.shape[-1])


def _pattern(x, hook):
    x = x.clone()
    x[..., 0] = 0.0
    return x / x.sum(-1, keepdim=True).clamp_min(1e-9)


def _z(x, hook):
    x = x.clone()
    x[:, :, 0] = 0.0
    return x


def _scores(x, hook):
    x = x.clone()
    x[..., 0] = x[..., 0] + 5.0
    return x


# (arch, hook) -> whether a returned edit reaches the logits
EDIT_TAKES_EFFECT = {
    "hook_resid_post": {a: True for a in ARCHES},
    "attn.hook_z": {a: True for a in ARCHES},
    # GPT-J's HF attention computes the pattern internally; the bridge only
    # observes it, warns and discards the edit.
    "attn.hook_pattern": {"gpt2": True, "neox": True, "gptj": False, "llama": True},
}
EDITS = {"hook_resid_post": _resid, "attn.hook_z": _z, "attn.hook_pattern": _pattern}


@pytest.mark.parametrize("hook", list(EDITS))
@pytest.mark.parametrize("arch", ARCHES)
def test_returned_edit_changes_logits(arch, hook):
    b = bridge(arch)
    t = tokens()
    base, _ = run(b, t)
    edited, msgs = run(b, t, [(f"blocks.1.{hook}", EDITS[hook])])
    changed = not torch.allclose(edited, base, atol=1e-6)
    assert changed == EDIT_TAKES_EFFECT[hook][arch]
    if not changed:
        assert any("discarded" in m for m in msgs)


@pytest.mark.parametrize("arch", ARCHES)
def test_attn_scores_behaviour(arch):
    """hook_attn_scores: pre-softmax and editable for gpt2/neox/llama, but on
    GPT-J (HF route) it carries the post-softmax pattern and edits are dropped."""
    b = bridge(arch)
    t = tokens()
    _, cache = b.run_with_cache(t)
    scores, pat = cache["blocks.1.attn.hook_attn_scores"], cache["blocks.1.attn.hook_pattern"]
    base, _ = run(b, t)
    edited, msgs = run(b, t, [("blocks.1.attn.hook_attn_scores", _scores)])
    if arch == "gptj":
        torch.testing.assert_close(scores, pat)
        torch.testing.assert_close(edited, base)
        assert any("discarded" in m for m in msgs)
    else:
        # masked entries hold a large negative value (finfo.min), not -inf
        assert scores[0, 0, 0, 1] < -1e30
        torch.testing.assert_close(torch.softmax(scores, -1), pat)
        assert not torch.allclose(edited, base, atol=1e-6)


def test_native_bridge_attn_scores_trap():
    """boot_native: hook_attn_scores == pattern and edits to it are ignored."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    cfg = TransformerBridgeConfig(
        n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=D_VOCAB, n_ctx=16, d_mlp=32,
        act_fn="gelu_new", normalization_type="LN", seed=0,
    )
    b = TransformerBridge.boot_native(cfg, tokenizer=make_word_tokenizer(D_VOCAB))
    t = tokens()
    _, cache = b.run_with_cache(t)
    torch.testing.assert_close(cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"])
    base, _ = run(b, t)
    edited, _ = run(b, t, [("blocks.0.attn.hook_attn_scores", _scores)])
    torch.testing.assert_close(edited, base)
    edited, _ = run(b, t, [("blocks.0.attn.hook_pattern", _pattern)])
    assert not torch.allclose(edited, base, atol=1e-6)


# ----------------------------------------------------------------- 3.9 equivalence
REFS = ("gpt2", "llama", "neox", "gptj")


@pytest.mark.parametrize("name", REFS)
def test_bridge_matches_tl39_logits(name):
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    sd = load_file(str(FIXTURES / f"{name}.safetensors"))
    ref = load_file(str(FIXTURES / f"{name}_ref.safetensors"))
    b = bridge_from_hooked_state(meta["cfg"], sd)
    with torch.no_grad():
        logits, cache = b.run_with_cache(ref["tokens"])
    torch.testing.assert_close(logits, ref["logits"], atol=1e-4, rtol=0)
    for key in ref:
        if key.startswith("blocks."):
            torch.testing.assert_close(cache[key], ref[key], atol=1e-4, rtol=0, msg=key)
    assert b.cfg.n_key_value_heads == meta["cfg"].get("n_key_value_heads")


def test_custom_tokenizer_without_bos_postprocessor():
    meta = json.loads((FIXTURES / "gpt2.json").read_text())
    sd = load_file(str(FIXTURES / "gpt2.safetensors"))
    tok = make_word_tokenizer(D_VOCAB, add_bos=False)
    b = bridge_from_hooked_state(meta["cfg"], sd, tokenizer=tok)
    assert b.to_tokens("w1 w2").tolist() == [[0, 3, 4]]
    assert b.to_tokens("w1 w2", prepend_bos=False).tolist() == [[3, 4]]
