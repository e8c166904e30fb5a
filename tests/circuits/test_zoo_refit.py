"""The last step of every zoo recipe: the unembedding bias removed and ``W_U`` refitted, every other weight
untouched. Checked against the biased model's own logits: exactly (LayerNorm, the fold) or in KL divergence
on prompts never fitted (RMSNorm, the distillation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import needs_hooked

pytestmark = [needs_hooked, pytest.mark.usefixtures("one_thread")]


def _tiny(base: str, seed: int = 0):
    """A tiny hooked model of ``base``'s architecture trained on nothing, with a random unembedding bias,
    and its recipe (tasks add and sub, 40 validation prompts each)."""
    from circuits.zoo import train as zoo_train

    cfg = dataclasses.replace(zoo_train.get_config(base), name="tiny", tasks=["add", "sub"], n_layers=2, d_model=32,
                              d_head=8, d_mlp=64, eval_n=40, seed=seed, phases=[], init_from=None)
    model = zoo_train.new_model(cfg, zoo_train.build_tokenizer(), "hooked").eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.unembed.b_U.copy_(torch.randn(model.cfg.d_vocab_out, generator=g))
        if base == "arith-gpt2":  # a LayerNorm as trained models have it: gains far from 1, a bias
            model.ln_final.w.copy_(0.2 + torch.rand(model.cfg.d_model, generator=g))
            model.ln_final.b.copy_(0.3 * torch.randn(model.cfg.d_model, generator=g))
    return model, cfg


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens)[:, -1].double()


def test_layernorm_models_fold_exactly_on_any_prompt():
    """After a LayerNorm the bias folds into ``W_U``: the logits are the biased model's on prompts of tasks
    that were never fitted too (three operands), and no weight but ``W_U`` and ``b_U`` moved."""
    from circuits.zoo.refit import refit_unembed

    model, cfg = _tiny("arith-gpt2")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = model.to_tokens(["12+30=", "99-7=", "5+6-7=", "40-3+2="])
    expected = _logits(model, tokens)
    report = refit_unembed(model, cfg)
    assert report["method"] == "fold" and report["fit"]["n"] == 4000 and report["val"]["n"] == 80
    assert float(model.unembed.b_U.detach().abs().max()) == 0.0
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"unembed.W_U", "unembed.b_U"}
    torch.testing.assert_close(_logits(model, tokens), expected, atol=1e-4, rtol=0)
    assert report["val"]["argmax_same"] == 1.0 and report["val"]["kl_max"] < 1e-6


def test_rmsnorm_models_are_distilled_and_the_report_is_measured():
    """After an RMSNorm no linear functional of the normed state is constant: the bias is distilled into
    ``W_U``. On the validation prompts (never fitted) the KL divergence from the biased model, recomputed
    here from the two models' logits, is the report's and far below that of dropping the bias."""
    from circuits.zoo.data import build_splits
    from circuits.zoo.refit import refit_unembed

    model, cfg = _tiny("arith-llama")
    _, val = build_splits(cfg, model.tokenizer)
    tokens = [torch.from_numpy(d.tokens) for d in val]
    old = [_logits(model, t) for t in tokens]
    b_U = model.unembed.b_U.detach().clone()
    dropped = [o - b_U.double() for o in old]  # the same model without its bias, nothing refitted

    def kl(a, b):
        p = F.log_softmax(a, -1)
        return (p.exp() * (p - F.log_softmax(b, -1))).sum(-1)

    report = refit_unembed(model, cfg)
    assert report["method"] == "distil" and 0 < report["lbfgs_evaluations"] <= 150 * 5 // 4  # L-BFGS max_eval
    new = [_logits(model, t) for t in tokens]
    measured = torch.cat([kl(o, n) for o, n in zip(old, new)])
    assert report["val"]["kl_mean"] == pytest.approx(float(measured.mean()), rel=1e-3, abs=1e-9)
    assert report["val"]["kl_max"] == pytest.approx(float(measured.max()), rel=1e-3, abs=1e-9)
    no_refit = float(torch.cat([kl(o, d) for o, d in zip(old, dropped)]).mean())
    assert report["val"]["kl_mean"] < 0.1 * no_refit and report["val"]["kl_mean"] <= report["fold"]["kl_mean"]


def test_a_model_without_a_bias_is_left_as_it_is():
    from circuits.zoo.refit import refit_unembed

    model, cfg = _tiny("arith-llama")
    with torch.no_grad():
        model.unembed.b_U.zero_()
    W = model.unembed.W_U.clone()
    assert refit_unembed(model, cfg) == {"method": "none"}
    assert torch.equal(model.unembed.W_U, W)


def test_a_folder_of_the_former_transformer_lens_format_converts_without_a_bias(tmp_path):
    """``convert_folder`` on a folder of the zoo's first format (TransformerLens names and config, a nonzero
    ``b_U``): the result is a plain Hugging Face checkpoint whose logits, in plain transformers and through
    ``zoo.load_dir``, are the biased original's (a LayerNorm model: the fold is exact)."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from circuits import zoo
    from circuits.zoo.export import convert_folder
    from circuits.zoo.tokenizer import save_tokenizer

    model, cfg = _tiny("arith-gpt2", seed=1)
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg.model_config(model.cfg.d_vocab)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if not k.endswith(("IGNORE", "mask"))}, str(folder / "model.safetensors"))
    save_tokenizer(model.tokenizer, folder / "tokenizer.json")
    tokens = model.to_tokens(["12+30=", "5+6-7="])
    expected = _logits(model, tokens)
    report = convert_folder(folder, tasks=("add", "sub"))
    assert report["refit"]["method"] == "fold" and max(report["hooked"], report["transformers"]) <= 1e-4
    assert not (folder / "unembed_bias.safetensors").exists()
    plain = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(tokens).logits[:, -1].double(), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(_logits(zoo.load_dir(folder), tokens), expected, atol=1e-4, rtol=0)
