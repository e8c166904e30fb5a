"""Zoo folders are plain Hugging Face checkpoints: ``transformers`` loads them as they are and gives the
logits of ``zoo.load`` (no unembedding bias beside the checkpoint, nothing added by the toolkit)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json

import pytest
import torch

from circuits import zoo

NAMES = zoo.available()
PROMPTS = ["42+20-15=", "120+31-5=", "7+8+9=", "99-98-1="]


@pytest.fixture(scope="module", params=NAMES)
def name(request) -> str:
    return request.param


def _plain(name: str):
    """Model and tokenizer loaded with nothing but transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = zoo.path(name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model, tok


def exact_llama(monkeypatch) -> None:
    """Hugging Face's Llama computes its RMSNorm and rotary angles in float32 even in a float64 model (a
    difference of up to 4e-5 in the logits of the zoo models from a ``HookedTransformer``); patched here
    to run in the model's dtype, as the ``HookedTransformer`` does, so that a float64 comparison measures
    the weights and not float32 rounding. (A ``TransformerBridge`` runs Hugging Face's own code: compared
    with it, nothing is patched.)"""
    from transformers.models.llama import modeling_llama as ml

    def rms(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rope(self, x, position_ids):
        c = self.config
        dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        inv = 1.0 / (c.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = torch.cat([position_ids[..., None].double() * inv] * 2, -1)
        return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", rms)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rope)


def _float64(model):
    """``model`` (a ``HookedTransformer``) in float64, its rotary tables recomputed in float64 (they are
    computed in float32 at construction)."""
    model = model.to(torch.float64)
    if model.cfg.positional_embedding_type == "rotary":
        for block in model.blocks:
            block.attn.rotary_sin, block.attn.rotary_cos = block.attn.calculate_sin_cos_rotary(
                model.cfg.rotary_dim, model.cfg.n_ctx, base=model.cfg.rotary_base, dtype=torch.float64)
    return model


def test_path_is_the_model_folder(name):
    assert zoo.path(name) == zoo.model_dir(name) == zoo.MODELS_DIR / name
    cfg = json.loads((zoo.path(name) / "config.json").read_text())
    assert cfg["architectures"] in (["GPT2LMHeadModel"], ["LlamaForCausalLM"])
    assert "planted" not in cfg  # zoo metadata lives in zoo.json / card.json
    assert (zoo.path(name) / "tokenizer_config.json").exists()


def test_plain_transformers_gives_the_zoo_logits(name, monkeypatch):
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` on the folder, with nothing added, give the logits of
    ``zoo.load(name)`` to 1e-5 (the planted model without its mask: plain transformers knows nothing of
    it), compared in float64 so that kernel rounding does not count. On TransformerLens 4.x the toolkit's
    model is a ``TransformerBridge``, whose Llama path keeps some float32 arithmetic of its own in a
    float64 model (1e-5..9e-5 from plain transformers whatever is patched): 1e-4 there."""
    from interventions.adapter import resolve_backend

    folder = zoo.path(name)
    assert not (folder / "unembed_bias.safetensors").exists()
    model, tok = _plain(name)
    expected_arch = "LlamaForCausalLM" if zoo.card(name)["arch"] == "llama" else "GPT2LMHeadModel"
    assert type(model).__name__ == expected_arch
    assert model.get_output_embeddings().bias is None and not model.config.tie_word_embeddings
    zm = zoo.load(name)
    if zoo.card(name).get("planted"):
        zm.reset_hooks(including_permanent=True)
    model = model.double()
    atol = 1e-5
    if resolve_backend(None) == "hooked":
        exact_llama(monkeypatch)
        zm = _float64(zm)
    else:
        zm = zm.to(torch.float64)
        atol = 1e-4 if expected_arch == "LlamaForCausalLM" else atol
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            assert torch.equal(ids, zm.to_tokens(prompt))  # BOS first, one token per number
            torch.testing.assert_close(model(ids).logits, zm(ids), atol=atol, rtol=0)


def test_default_model_answers_with_plain_transformers():
    model, tok = _plain(zoo.DEFAULT_MODEL)
    ids = tok("42+20-15=", return_tensors="pt").input_ids
    with torch.no_grad():
        assert tok.decode([int(model(ids).logits[0, -1].argmax())]) == "47"


def test_a_folder_of_the_former_format_loads_with_its_bias_and_a_warning(tmp_path):
    """A folder with ``unembed_bias.safetensors`` beside the checkpoint (the zoo's former format) still
    loads: the bias is added to the logits, on every backend, with a ``FutureWarning``."""
    import shutil

    from safetensors.torch import save_file

    from interventions.adapter import resolve_backend

    folder = tmp_path / "old"
    shutil.copytree(zoo.path(zoo.DEFAULT_MODEL), folder)
    new = zoo.load(zoo.DEFAULT_MODEL)
    b_U = torch.linspace(-1.0, 1.0, new.cfg.d_vocab_out)
    save_file({"lm_head.bias": b_U}, str(folder / "unembed_bias.safetensors"))
    ids = new.to_tokens("42+20-15=")
    with torch.no_grad():
        expected = new(ids) + b_U
    for backend in dict.fromkeys([resolve_backend(None), "bridge"]):
        with pytest.warns(FutureWarning, match="unembed_bias.safetensors.*plain transformers ignores it"):
            old = zoo.load_dir(folder, backend=backend)
        with torch.no_grad():
            torch.testing.assert_close(old(ids), expected, atol=1e-4, rtol=0)


def test_a_biased_head_is_never_saved(tmp_path):
    from circuits.zoo import hf as zoo_hf
    from interventions.convert import with_unembed_bias

    model, tok = _plain(zoo.DEFAULT_MODEL)
    with_unembed_bias(model, torch.zeros(model.config.vocab_size))
    with pytest.raises(ValueError, match="lm_head has no bias: remove the unembedding bias first"):
        zoo_hf.save_hf(tmp_path / "m", model, tok)
    assert not (tmp_path / "m").exists()


def test_planted_mask_is_recorded_in_zoo_json():
    for name in NAMES:
        meta = zoo.path(name) / "zoo.json"
        planted = zoo.card(name).get("planted")
        if planted is None:
            assert not meta.exists() or "planted" not in json.loads(meta.read_text())
        else:
            spec = json.loads(meta.read_text())["planted"]
            assert spec == {k: planted[k] for k in ("self_all", "last_full")}


def test_transformer_bridge_boots_the_folder():
    """TransformerLens' own ``boot_transformers`` on the local folder (no zoo code involved)."""
    bridge_mod = pytest.importorskip("transformer_lens.model_bridge")
    folder = str(zoo.path(zoo.DEFAULT_MODEL))
    model, tok = _plain(zoo.DEFAULT_MODEL)
    bridge = bridge_mod.TransformerBridge.boot_transformers(folder, tokenizer=tok)
    ids = tok("42+20-15=", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(bridge(ids), model(ids).logits, atol=1e-4, rtol=0)
