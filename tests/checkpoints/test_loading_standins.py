"""load_model on stand-in checkpoints saved under real repository names: config, weights, tokenizer
and BOS convention come from the (offline) cache; limitations of TransformerLens raise one clear line."""

from __future__ import annotations

import pytest
import torch

from circuits.errors import ModelLoadError
from circuits.models import hub, loading
from circuits.prompts import sampling
from circuits.tasks import catalogue as tasks
from tests import standins
from tests.checkpoints.conftest import combos
from tests.conftest import BACKENDS, needs_hooked

TEXT = ["The sum of 12 and 437 is", "7+8="]


def _works(key: str, backend: str) -> bool:
    return backend == "bridge" or standins.STANDINS[key].hooked


@pytest.mark.parametrize("key,backend", combos())
def test_load_model_reads_the_checkpoint(key, backend, load_standin, standin_hub):
    if not _works(key, backend):
        pytest.skip("TransformerLens builds this name from a built-in config (see test_builtin_config_is_refused)")
    model = load_standin(key, backend)
    saved = standins.snapshot_config(standin_hub, key)
    assert model.cfg.d_model == standins.D_MODEL and model.cfg.n_layers == standins.N_LAYERS
    assert model.cfg.d_vocab == saved["vocab_size"] == len(model.tokenizer)
    # The tokenizer is the saved one: its own encoding, independent of TransformerLens.
    ref = standins.build_tokenizer(standins.STANDINS[key].tokenizer)
    bos = tasks.resolve_bos(model, None)
    for text in TEXT:
        expect = ([bos] if bos is not None else []) + ref.encode(text, add_special_tokens=False)
        assert model.to_tokens(text)[0].tolist() == expect


@needs_hooked
@pytest.mark.parametrize("key", [k for k, s in standins.STANDINS.items() if s.hooked])
def test_hooked_and_bridge_give_the_same_logits(key, load_standin):
    """Both loaders read the same weights: logits agree (float32) on real prompts."""
    toks = load_standin(key, "hooked").to_tokens(TEXT[1])
    with torch.inference_mode():
        a = load_standin(key, "hooked")(toks)
        b = load_standin(key, "bridge")(toks)
    torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@needs_hooked
@pytest.mark.parametrize("name,built_in", [("meta-llama/Meta-Llama-3-8B", "d_model 4096, n_layers 32, d_vocab 128256"),
                                           ("google/gemma-2b", "d_model 2048, n_layers 18, d_vocab 256000")])
def test_builtin_config_is_refused(standin_hub, name, built_in):
    """TransformerLens 3.9 builds Llama and Gemma names from built-in configs (8B / 2B here): one clear
    line, no allocation of the built-in size."""
    with pytest.raises(ValueError, match=rf"^HookedTransformer.from_pretrained builds '{name}' from "
                                         rf"TransformerLens's built-in config \({built_in}\), not from the "
                                         rf"checkpoint .*\(d_model 64, n_layers 2, .*backend='bridge'"):
        loading.load_model(name, backend="hooked")


def test_llama3_rope_scaling_reaches_the_model(load_standin, standin_hub):
    """The Llama-3 stand-in carries rope_scaling of type llama3; the loaded config keeps it."""
    saved = standins.snapshot_config(standin_hub, "yi")
    rope = saved.get("rope_scaling") or saved.get("rope_parameters")
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    for backend in BACKENDS:  # (hooked vs bridge logits: HookedTransformer's rope against Hugging Face's)
        cfg = load_standin("yi", backend).cfg
        assert cfg.n_key_value_heads == 2 and cfg.NTK_by_parts_factor == 8.0
        assert cfg.NTK_by_parts_low_freq_factor == 1.0 and cfg.NTK_by_parts_high_freq_factor == 4.0


@pytest.mark.parametrize("key,backend", combos(["pythia", "gpt2"]))
def test_bos_follows_the_model_default(key, backend, load_standin):
    """Pythia (GPT-NeoX) prepends no BOS in TransformerLens; the prompts follow the model, and the search
    precondition names --prepend-bos."""
    model = load_standin(key, backend)
    ds = tasks.filter_single_token(tasks.build_task("add", n=40, seed=0), model, verbose=False)[0]
    default = tasks.to_layouts(model, ds)[0]
    with_bos = tasks.to_layouts(model, ds, prepend_bos=True)[0]
    bos = model.tokenizer.bos_token_id
    assert (with_bos.tokens[:, 0] == bos).all() and with_bos.bos == bos
    for lay, flag in ((default, None), (with_bos, True)):
        assert lay.tokens[0].tolist() == model.to_tokens(lay.prompts[0], prepend_bos=flag)[0].tolist()
    if key == "pythia":
        assert default.bos is None and model.cfg.default_prepend_bos is False
        with pytest.raises(ValueError, match=r"need BOS \(token \d+\) at position 0 .* use --prepend-bos"):
            sampling.check_bos(model, default.tokens)
    else:
        assert default.bos == bos
        sampling.check_bos(model, default.tokens)
    sampling.check_bos(model, with_bos.tokens)


@pytest.mark.parametrize("key,backend", combos(["qwen2"]))
def test_qwen2_has_no_bos_token_and_uses_eos_when_asked(key, backend, load_standin):
    """Qwen2's tokenizer has no BOS token (TransformerLens 3.9's HookedTransformer sets it to EOS): no BOS
    by default, ``<|endoftext|>`` at position 0 when asked for."""
    model = load_standin(key, backend)
    assert model.cfg.default_prepend_bos is False and tasks.resolve_bos(model, None) is None
    assert standins.build_tokenizer("qwen2").bos_token_id is None
    assert tasks.resolve_bos(model, True) == model.tokenizer.convert_tokens_to_ids("<|endoftext|>")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_loads(backend, load_standin):
    """--dtype bfloat16: every parameter in bfloat16 (the bridge's folded float32 biases are cast), and
    the forward pass runs on CPU."""
    for key in ("gpt2", "pythia", "qwen2", "yi") + (("llama3", "gemma") if backend == "bridge" else ()):
        model = load_standin(key, backend, "bfloat16")
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}, key
        with torch.inference_mode():
            assert model(model.to_tokens(TEXT[1])).dtype == torch.bfloat16


@needs_hooked
def test_transformerlens_spelling_of_a_cached_name(tmp_path):
    """TransformerLens 3.9 looks GPT-J up as 'EleutherAI/gpt-j-6B'; a cache holding only the Hugging Face
    spelling 'EleutherAI/gpt-j-6b' gets a one-line error that says so, and the bridge loads it."""
    only_lower = standins.StandIn("gptj", "EleutherAI/gpt-j-6b", "gptj", "gpt2")
    standins.save_standin(only_lower, tmp_path)
    with standins.offline_cache(tmp_path):
        with pytest.raises(ValueError, match=r"^HookedTransformer.from_pretrained looks up 'EleutherAI/gpt-j-6b' as "
                                             r"'EleutherAI/gpt-j-6B', which is not in the local Hugging Face cache"):
            loading.load_model("EleutherAI/gpt-j-6b", backend="hooked")
        assert loading.load_model("EleutherAI/gpt-j-6b", backend="bridge").cfg.d_model == standins.D_MODEL


def test_cached_spelling_finds_the_weights_under_either_spelling(tmp_path):
    """GPT-J is 'EleutherAI/gpt-j-6b' on the hub and 'EleutherAI/gpt-j-6B' in TransformerLens 3.x: whichever is
    asked for, the spelling in the cache is found (cache folders are case-sensitive, the hub is not)."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    standins.save_standin(standins.StandIn("gptj", "EleutherAI/gpt-j-6b", "gptj", "gpt2"), lower)
    standins.save_standin(standins.StandIn("gptj", "EleutherAI/gpt-j-6B", "gptj", "gpt2"), upper)
    for cache, spelling in ((lower, "EleutherAI/gpt-j-6b"), (upper, "EleutherAI/gpt-j-6B")):
        with standins.offline_cache(cache):
            for asked in ("EleutherAI/gpt-j-6b", "EleutherAI/gpt-j-6B", "eleutherai/GPT-J-6B"):
                assert hub.cached_spelling(asked) == spelling
            assert hub.cached_spelling("meta-llama/Meta-Llama-3-8B") is None
    # A config without weights is not a cached model.
    snapshot = lower / "models--EleutherAI--gpt-j-6b" / "snapshots" / standins.REVISION
    for weights in snapshot.glob("*.safetensors"):
        weights.unlink()
    with standins.offline_cache(lower):
        assert not hub.has_cached_weights("EleutherAI/gpt-j-6b")
        assert hub.cached_spelling("EleutherAI/gpt-j-6B") is None


def snapshot_folder(hub_cache, key: str):
    """The folder of stand-in ``key``'s checkpoint, to load as a local path rather than by its hub name."""
    return hub_cache / ("models--" + standins.STANDINS[key].repo.replace("/", "--")) / "snapshots" / standins.REVISION


@pytest.mark.parametrize("key,backend", combos(["gpt2", "llama3"]))
def test_a_local_folder_loads_like_plain_transformers(key, backend, standin_root):
    """A Hugging Face folder given as a path: logits of plain transformers on that folder (centred per position:
    the processed weights centre the unembedding); on hooked (3.9) the model is built from the folder's config
    and weights, and a rotary scaling it cannot carry (Llama-3's) is refused naming the bridge."""
    from transformers import AutoModelForCausalLM

    folder = str(snapshot_folder(standin_root, key))
    if backend == "hooked" and key == "llama3":
        with pytest.raises(ModelLoadError, match=r"^rope_type 'llama3': .*--backend bridge\)$"):
            loading.load_model(folder, backend=backend)
        return
    model = loading.load_model(folder, backend=backend)
    assert model.cfg.model_name == folder
    tokens = model.to_tokens(TEXT[1])
    with torch.inference_mode():
        got, expected = model(tokens), AutoModelForCausalLM.from_pretrained(folder).eval()(tokens).logits
    centred = [x - x.mean(-1, keepdim=True) for x in (got, expected)]
    torch.testing.assert_close(*centred, atol=1e-4, rtol=0)


@needs_hooked
def test_an_architecture_hooked_cannot_build_from_a_folder_is_refused(standin_root):
    """A folder of an architecture the hooked build does not cover: one line naming --backend bridge."""
    with pytest.raises(ModelLoadError, match=r"^model_type 'qwen2': a HookedTransformer is built here from "
                                                     r"GPT2LMHeadModel and LlamaForCausalLM checkpoints only; load it "
                                                     r"with backend='bridge' \(--backend bridge\)$"):
        loading.load_model(str(snapshot_folder(standin_root, "qwen2")), backend="hooked")
