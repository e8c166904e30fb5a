"""Zoo folders are standard Hugging Face checkpoints: plain ``transformers`` loads them as they are and
gives the logits of ``zoo.load`` (up to the unembedding bias kept beside the checkpoint)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json

import pytest
import torch

from circuits import zoo
from tests.conftest import zoo_float64_atol

NAMES = zoo.available()
PROMPTS = ["42+20-15=", "120+31-5=", "7+8+9=", "99-98-1="]


@pytest.fixture(scope="module", params=NAMES)
def name(request) -> str:
    return request.param


def _plain(name: str):
    """Model, tokenizer and unembedding bias loaded with nothing but transformers and safetensors."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = zoo.path(name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    bias = folder / "unembed_bias.safetensors"
    b_U = load_file(str(bias))["lm_head.bias"] if bias.exists() else torch.zeros(model.config.vocab_size)
    return model, tok, b_U


def test_path_is_the_model_folder(name):
    assert zoo.path(name) == zoo.model_dir(name) == zoo.MODELS_DIR / name
    cfg = json.loads((zoo.path(name) / "config.json").read_text())
    assert cfg["architectures"] in (["GPT2LMHeadModel"], ["LlamaForCausalLM"])
    assert "planted" not in cfg  # zoo metadata lives in zoo.json / card.json
    assert (zoo.path(name) / "tokenizer_config.json").exists()


def test_plain_transformers_gives_the_zoo_logits(name):
    """``AutoModelForCausalLM`` + ``AutoTokenizer`` on the folder, plus ``b_U``, equal ``zoo.load(name)``
    (the planted model without its mask: plain transformers knows nothing of it), compared in float64 so
    that kernel rounding does not count (tolerance: ``zoo_float64_atol``)."""
    model, tok, b_U = _plain(name)
    expected_arch = "LlamaForCausalLM" if zoo.card(name)["arch"] == "llama" else "GPT2LMHeadModel"
    assert type(model).__name__ == expected_arch
    assert model.get_output_embeddings().bias is None  # a standard head: the bias is kept beside it
    zm = zoo.load(name)
    if zoo.card(name).get("planted"):
        zm.reset_hooks(including_permanent=True)
    model, zm, b_U = model.double(), zm.to(torch.float64), b_U.double()
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok(prompt, return_tensors="pt").input_ids
            assert torch.equal(ids, zm.to_tokens(prompt))  # BOS first, one token per number
            atol = zoo_float64_atol(zoo.card(name))
            torch.testing.assert_close(model(ids).logits + b_U, zm(ids), atol=atol, rtol=0)


def test_default_model_answers_with_plain_transformers():
    model, tok, b_U = _plain(zoo.DEFAULT_MODEL)
    ids = tok("42+20-15=", return_tensors="pt").input_ids
    with torch.no_grad():
        assert tok.decode([int((model(ids).logits[0, -1] + b_U).argmax())]) == "47"


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
    model, tok, b_U = _plain(zoo.DEFAULT_MODEL)
    bridge = bridge_mod.TransformerBridge.boot_transformers(folder, tokenizer=tok)
    ids = tok("42+20-15=", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(bridge(ids), model(ids).logits, atol=1e-4, rtol=0)
