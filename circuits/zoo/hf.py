"""The zoo's on-disk format, a standard Hugging Face checkpoint, and its conversions.

A model folder holds ``config.json`` (a ``GPT2Config`` / ``LlamaConfig`` with ``architectures``),
``model.safetensors`` (Hugging Face parameter names), ``tokenizer.json`` + ``tokenizer_config.json``, so
``transformers.AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)``
load it as it is and computes the logits ``zoo.load`` computes. Beside it, ``zoo.json`` holds zoo
metadata (the planted structure of a ground truth, a former planted attention mask ``"planted"``).

The zoo's ``HookedTransformer`` models are trained with an unembedding bias ``b_U``, which a standard
``lm_head`` lacks: every recipe ends by refitting the unembedding without it
(:mod:`circuits.zoo.refit`), so no folder has one. A folder of the former format, with the bias kept
beside the checkpoint in ``unembed_bias.safetensors``, still loads (:func:`load_hf` returns the bias, with
a ``FutureWarning``); plain ``transformers`` ignores that file.

Conversions: :func:`hf_from_hooked` (TransformerLens state dict -> Hugging Face model, through
:func:`interventions.convert.hooked_state_to_hf`), :func:`hooked_config` (Hugging Face config ->
``HookedTransformerConfig`` keyword arguments) and :func:`hooked_state` (Hugging Face model ->
TransformerLens state dict, through TransformerLens' own ``convert_gpt2_weights`` /
``convert_llama_weights``, completed with the attention and MLP biases the Llama converter leaves at 0).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from circuits.errors import ArgumentError, ModelLoadError
from interventions.types import Model

__all__ = ["WEIGHTS", "BIAS", "META", "ARCHITECTURES", "is_hf", "hf_config", "hf_from_hooked", "hf_state_from_hooked",
           "hooked_config", "hooked_state", "load_hf", "read_meta", "save_hf"]

WEIGHTS, BIAS, META = "model.safetensors", "unembed_bias.safetensors", "zoo.json"
ARCHITECTURES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
"""Zoo architecture -> Hugging Face model class named in ``config.json``."""


def is_hf(model: Model) -> bool:
    """Whether ``model`` is a Hugging Face ``PreTrainedModel`` (not a HookedTransformer or a bridge)."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def _arch(hf_config) -> str:
    """``"gpt2"`` or ``"llama"`` for a Hugging Face config; :class:`~circuits.errors.ModelLoadError` naming
    the bridge for anything else."""
    if hf_config.model_type not in ARCHITECTURES:
        raise ModelLoadError(f"model_type {hf_config.model_type!r}: a HookedTransformer is built here from "
                             f"{' and '.join(ARCHITECTURES.values())} checkpoints only; load it with "
                             f"backend='bridge' (--backend bridge)")
    return hf_config.model_type


def hf_config(cfg, tokenizer) -> Any:
    """The Hugging Face config of recipe ``cfg`` (a :class:`~circuits.zoo.recipes.TrainConfig`), shaped
    as :func:`hf_from_hooked` writes the shipped models: no dropout, untied unembedding, eager attention,
    biases on the Llama attention and MLP projections, special token ids of ``tokenizer``."""
    import transformers as tf

    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.bos_token_id,
               pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    if cfg.arch == "gpt2":
        config: tf.PretrainedConfig = tf.GPT2Config(
            vocab_size=len(tokenizer), n_positions=cfg.n_ctx, n_embd=cfg.d_model, n_layer=cfg.n_layers,
            n_head=cfg.n_heads, n_inner=cfg.d_mlp, activation_function="gelu_new", layer_norm_epsilon=1e-5,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)
    elif cfg.arch == "llama":
        config = tf.LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=cfg.n_ctx,
                                hidden_size=cfg.d_model, intermediate_size=cfg.d_mlp,
                                num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                                num_key_value_heads=cfg.n_key_value_heads or cfg.n_heads, head_dim=cfg.d_head,
                                hidden_act="silu", rms_norm_eps=1e-5, attention_bias=True, mlp_bias=True,
                                rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, **ids)
    else:
        raise ArgumentError(f"unknown arch {cfg.arch!r}; known: {', '.join(ARCHITECTURES)}")
    config.architectures = [ARCHITECTURES[cfg.arch]]
    config._attn_implementation = "eager"
    return config


def hf_from_hooked(cfg_dict: dict, state: dict, tokenizer=None) -> tuple[Any, Any]:
    """``(hf_model, b_U)``: the Hugging Face causal LM with the weights of a ``HookedTransformer`` state
    dict (config ``cfg_dict``), without an ``lm_head`` bias, and the unembedding bias it lacks (``None``
    if it is zero). ``tokenizer`` sets the special token ids of the config."""
    import torch

    from interventions.convert import hooked_state_to_hf

    arch, hf = hooked_state_to_hf(cfg_dict, state)
    b_U = state.get("unembed.b_U")
    head = hf.get_output_embeddings()
    if head.bias is not None:  # hooked_state_to_hf swapped in a biased head: a standard one has none
        plain = torch.nn.Linear(head.in_features, head.out_features, bias=False)
        with torch.no_grad():
            plain.weight.copy_(head.weight)
        hf.set_output_embeddings(plain)
    hf.config.architectures = [ARCHITECTURES[arch]]
    if tokenizer is not None:
        hf.config.bos_token_id = hf.config.eos_token_id = tokenizer.bos_token_id
        hf.config.pad_token_id = tokenizer.pad_token_id
    bias = b_U.detach().float().clone() if b_U is not None and bool(b_U.abs().max() > 0) else None
    return hf.eval(), bias


def hf_state_from_hooked(cfg_dict: dict, state: dict) -> dict:
    """The Hugging Face state dict (``model.safetensors`` names) of a ``HookedTransformer`` state dict."""
    hf, _ = hf_from_hooked(cfg_dict, state)
    return {k: v.detach().contiguous() for k, v in hf.state_dict().items()}


def hooked_config(hf_config) -> dict:
    """Keyword arguments of ``HookedTransformerConfig`` for a GPT-2 or Llama Hugging Face config (a zoo
    model's or a pretrained checkpoint's): widths, heads (grouped-query attention as ``n_key_value_heads``),
    norm epsilon, rotary base (``rope_theta``), BOS prepended by default as ``from_pretrained`` does.
    :class:`~circuits.errors.ModelLoadError` naming the bridge for another architecture or a rotary
    scaling (``rope_type`` other than ``"default"``) that this config does not carry over."""
    arch = _arch(hf_config)
    c = hf_config
    if arch == "gpt2":
        return dict(n_layers=c.n_layer, d_model=c.n_embd, n_heads=c.n_head, d_head=c.n_embd // c.n_head,
                    d_mlp=c.n_inner or 4 * c.n_embd, n_ctx=c.n_positions, d_vocab=c.vocab_size,
                    d_vocab_out=c.vocab_size, act_fn=c.activation_function, eps=c.layer_norm_epsilon,
                    normalization_type="LN", positional_embedding_type="standard", default_prepend_bos=True)
    rope = getattr(c, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ModelLoadError(f"rope_type {rope['rope_type']!r}: a HookedTransformer is built here with unscaled "
                             f"rotary embeddings only; load it with backend='bridge' (--backend bridge)")
    kv = c.num_key_value_heads
    return dict(n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads,
                d_head=c.head_dim, d_mlp=c.intermediate_size, n_ctx=c.max_position_embeddings,
                d_vocab=c.vocab_size, d_vocab_out=c.vocab_size, act_fn=c.hidden_act, eps=c.rms_norm_eps,
                normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=c.head_dim,
                rotary_base=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))), gated_mlp=True,
                final_rms=True, n_key_value_heads=None if kv == c.num_attention_heads else kv,
                default_prepend_bos=True)


def hooked_state(hf_model, cfg, b_U=None) -> dict:
    """The ``HookedTransformer`` state dict (config ``cfg``) of a GPT-2 or Llama Hugging Face model, with ``b_U``
    as the unembedding bias. Weights go through TransformerLens' ``convert_gpt2_weights`` /
    ``convert_llama_weights``; the Llama attention and MLP biases, which that converter sets to 0, are
    copied from the model (the MLP bias lives in ``down_proj``, so ``b_in`` is 0). ``ModelLoadError`` if the
    gate or up projection has a nonzero bias (a ``HookedTransformer`` gated MLP has no place for it)."""
    import torch
    from einops import rearrange

    sd: dict = {}
    if _arch(hf_model.config) == "gpt2":
        from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

        sd = convert_gpt2_weights(hf_model, cfg)
    else:
        from transformer_lens.pretrained.weight_conversions import convert_llama_weights

        sd = convert_llama_weights(hf_model, cfg)
        n, kv, h = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head
        g = "_" if cfg.n_key_value_heads is not None else ""
        for layer_idx, layer in enumerate(hf_model.model.layers):
            p, a, m = f"blocks.{layer_idx}.", layer.self_attn, layer.mlp
            for name, lin in (("gate_proj", m.gate_proj), ("up_proj", m.up_proj)):
                if lin.bias is not None and bool(lin.bias.abs().max() > 0):
                    raise ModelLoadError(f"layer {layer_idx} mlp.{name} has a nonzero bias, which a HookedTransformer "
                                         f"gated MLP cannot hold: load this model with backend='bridge'")
            for key, lin, heads in (("attn.b_Q", a.q_proj, n), (f"attn.{g}b_K", a.k_proj, kv),
                                    (f"attn.{g}b_V", a.v_proj, kv)):
                if lin.bias is not None:
                    sd[p + key] = rearrange(lin.bias, "(n_heads d_head) -> n_heads d_head", n_heads=heads, d_head=h)
            for key, lin in (("attn.b_O", a.o_proj), ("mlp.b_out", m.down_proj)):
                if lin.bias is not None:
                    sd[p + key] = lin.bias
    sd["unembed.b_U"] = b_U if b_U is not None else torch.zeros(cfg.d_vocab_out)
    return {k: v.detach().clone() for k, v in sd.items()}


def read_meta(folder: str | Path) -> dict:
    """The folder's ``zoo.json`` (``{}`` if there is none)."""
    path = Path(folder) / META
    return json.loads(path.read_text()) if path.exists() else {}


SIZE_FIELDS = ("num_hidden_layers", "n_layer", "n_layers", "hidden_size", "n_embd", "d_model", "intermediate_size",
               "n_inner", "d_mlp", "vocab_size")
"""The ``config.json`` fields :func:`parameter_floor` reads."""


def parameter_floor(config: dict) -> int:
    """A lower bound of the parameters a Hugging Face ``config.json`` asks for: per block the attention
    (``4 d^2``) and two MLP matrices (``2 d ff``), and the embedding (``V d``)."""
    def num(*keys: str, default: int = 0) -> int:
        for k in keys:
            v = config.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return max(0, v)
        return default

    d = num("hidden_size", "n_embd", "d_model")
    layers = num("num_hidden_layers", "n_layer", "n_layers")
    ff = num("intermediate_size", "n_inner", "d_mlp", default=4 * d) or 4 * d
    return layers * (4 * d * d + 2 * d * ff) + num("vocab_size") * d


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
"""Files of a model folder that hold weights (their sizes bound what its ``config.json`` may ask for)."""


def check_size(folder: str | Path) -> None:
    """``ValueError`` naming ``config.json`` and its size fields before anything is allocated, when it asks for
    more parameters (float32) than the folder's weight files hold (:data:`WEIGHT_SUFFIXES`; twice their bytes,
    for 16-bit weights) or this machine's memory can take (a config of 4096 blocks of width 65536 would
    otherwise try to allocate hundreds of terabytes). Reads ``config.json`` only: milliseconds."""
    import os

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        raise ModelLoadError(f"{folder / 'config.json'} is not valid JSON") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{folder / 'config.json'} is not a JSON object")
    need = 4 * parameter_floor(config)
    files = [p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()] if folder.is_dir() else []
    have = sum(p.stat().st_size for p in files) if files else None
    holds = f"{files[0].name} holds" if len(files) == 1 else f"its {len(files)} weight files hold"
    fields = ", ".join(f"{k}={config[k]}" for k in SIZE_FIELDS if isinstance(config.get(k), int))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        memory = None
    gb = lambda n: f"{n / 1e9:.3g} GB"  # noqa: E731
    if have is not None and need > 2 * have + (1 << 20):
        raise ModelLoadError(f"{folder / 'config.json'} asks for at least {gb(need)} of float32 weights "
                             f"({fields}), but "
                             f"{holds} {gb(have)}: the config does not describe these weights")
    if memory is not None and need > memory:
        raise ModelLoadError(f"{folder / 'config.json'} asks for at least {gb(need)} of float32 weights "
                             f"({fields}), more "
                             f"than this machine's {gb(memory)} of memory")


def load_hf(folder: str | Path) -> tuple[Any, Any]:
    """``(hf_model, b_U)``: the folder's Hugging Face model (``from_pretrained``, offline, eager attention,
    eval mode) and the unembedding bias of a folder of the former format (``unembed_bias.safetensors``,
    with a ``FutureWarning``), else ``None``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").exists() or "architectures" not in json.loads((folder / "config.json").read_text()):
        raise ModelLoadError(f"{folder} is not a Hugging Face model folder (config.json without 'architectures'): "
                             f"convert it with circuits.zoo.export.convert_folder({str(folder)!r})")
    check_size(folder)
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation must not move the caller's RNG
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    hf.load_state_dict(load_file(str(folder / WEIGHTS)), strict=True)  # same tensors as from_pretrained, quietly
    b_U = None
    if (folder / BIAS).exists():
        import warnings

        warnings.warn(f"{folder} keeps an unembedding bias beside the checkpoint ({BIAS}, the zoo's former "
                      f"format): added to the zoo model, but plain transformers ignores it; re-export the model "
                      f"without it (circuits.zoo.refit.refit_unembed, then circuits.zoo.export.export)",
                      FutureWarning, stacklevel=3)
        b_U = load_file(str(folder / BIAS))["lm_head.bias"]
    return hf.float().eval(), b_U


def save_hf(folder: str | Path, hf_model, tokenizer, meta: dict | None = None) -> None:
    """Write ``hf_model`` (config + ``model.safetensors``), ``tokenizer`` (``tokenizer.json`` +
    ``tokenizer_config.json``) and ``meta`` (``zoo.json``, if any) into ``folder``; files of a previous
    format in the folder are replaced (a former ``unembed_bias.safetensors`` is removed).
    :class:`~circuits.errors.ArgumentError` if the model's ``lm_head`` has a bias: refit it away first
    (:mod:`circuits.zoo.refit`)."""
    from safetensors.torch import save_file

    from circuits.store.atomic import write_files, write_text, write_with
    from circuits.zoo.tokenizer import save_tokenizer

    head = hf_model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ArgumentError("a zoo folder is a plain Hugging Face checkpoint, whose lm_head has no bias: remove the "
                            "unembedding bias first (circuits.zoo.refit.refit_unembed)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # every file through the atomic writer (circuits.store.atomic): a killed export leaves whole files only
    write_with(folder / "config.json", lambda p: hf_model.config.to_json_file(str(p)))
    write_with(folder / WEIGHTS, lambda p: save_file({k: v.detach().float().contiguous()
                                                      for k, v in hf_model.state_dict().items()},
                                                     str(p), metadata={"format": "pt"}))
    if (folder / BIAS).exists():
        (folder / BIAS).unlink()
    written = write_files(folder, lambda d: tokenizer.save_pretrained(str(d)))
    # without the truncation/padding save_pretrained keeps
    write_with(folder / "tokenizer.json", lambda p: save_tokenizer(tokenizer, p))
    tcfg = json.loads(next(p for p in written if p.name == "tokenizer_config.json").read_text())
    tcfg["add_bos_token"] = True  # the zoo prompts start with BOS
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # the class name older transformers know too
    write_text(folder / "tokenizer_config.json", json.dumps(tcfg, indent=2) + "\n")
    if meta:
        write_text(folder / META, json.dumps(meta, indent=1) + "\n")
    elif (folder / META).exists():
        (folder / META).unlink()
