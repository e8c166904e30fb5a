"""HookedTransformer weights as a Hugging Face model, and as a ``TransformerBridge``.

:func:`hooked_state_to_hf` converts a 3.x ``HookedTransformer`` config and ``state_dict`` back into a
Hugging Face ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` / ``GPTNeoXForCausalLM`` (the inverse of
TransformerLens' HF-to-TL conversion); :func:`bridge_from_hooked_state` wraps it with
``TransformerBridge.boot_transformers(..., hf_model=...)``, without ``enable_compatibility_mode()``, so
the bridge has the logits of the saved model (to ~1e-6 in float32).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import rearrange

from .backends.bridge import boot, is_bridge
from .tokenization import make_word_tokenizer

ARCHES = ("gpt2", "neox", "gptj", "llama")
"""Architecture shapes :func:`bridge_from_hooked_state` converts (GPT-J-shaped models use the NeoX class)."""


_UNSUPPORTED_TRUE = (
    "use_local_attn", "use_qk_norm", "use_logn_attn", "use_dynamic_ntk_rope",
    "use_NTK_by_parts_rope", "use_yarn_rope", "post_embedding_ln", "attn_only",
    "use_normalization_before_and_after", "use_attention_sinks", "shortformer_pos",
)


def _check_cfg(c: dict) -> None:
    bad = [k for k in _UNSUPPORTED_TRUE if c.get(k)]
    if bad:
        raise NotImplementedError(f"HookedTransformer options not supported by the bridge conversion: {bad}")
    if c.get("final_rms") and not (c.get("normalization_type") or "").upper().startswith("RMS"):
        raise NotImplementedError("final_rms with LayerNorm blocks is not supported")
    if c.get("num_experts"):
        raise NotImplementedError("mixture-of-experts configs are not supported")
    if c.get("attention_dir", "causal") != "causal":
        raise NotImplementedError("only causal attention is supported")
    for k in ("attn_scores_soft_cap", "output_logits_soft_cap"):
        if (c.get(k) or -1.0) > 0:
            raise NotImplementedError(f"{k} is not supported")
    if c["n_heads"] * c["d_head"] != c["d_model"] and not c.get("gated_mlp"):
        raise NotImplementedError("d_model must equal n_heads * d_head for GPT-2/NeoX/GPT-J shapes")
    if c.get("use_attn_scale", True):
        scale = c.get("attn_scale", -1.0)
        if scale not in (None, -1.0) and not math.isclose(scale, math.sqrt(c["d_head"]), rel_tol=1e-6):
            raise NotImplementedError(f"attn_scale={scale} != sqrt(d_head) is not supported")
    else:
        raise NotImplementedError("use_attn_scale=False is not supported")
    if (c.get("d_vocab_out") or c["d_vocab"]) not in (-1, c["d_vocab"]):
        raise NotImplementedError("d_vocab_out != d_vocab is not supported")
    if (c.get("rotary_scaling_factor") or 1.0) != 1.0:
        raise NotImplementedError("rotary_scaling_factor != 1 is not supported")


def _pick_arch(c: dict) -> str:
    norm = (c.get("normalization_type") or "").upper()
    rotary = c.get("positional_embedding_type", "standard") == "rotary"
    if c.get("gated_mlp") or norm.startswith("RMS"):
        if not (c.get("gated_mlp") and norm.startswith("RMS") and rotary and not c.get("parallel_attn_mlp")):
            raise NotImplementedError("RMSNorm/gated-MLP configs must be Llama-shaped "
                                      "(RMS + rotary + gated, sequential)")
        return "llama"
    if not norm.startswith("LN"):
        raise NotImplementedError(f"normalization_type={c.get('normalization_type')!r} not supported")
    if not rotary:
        if c.get("parallel_attn_mlp"):
            raise NotImplementedError("parallel attn/MLP with learned positions is not supported")
        if c.get("positional_embedding_type", "standard") != "standard":
            raise NotImplementedError(f"positional_embedding_type={c['positional_embedding_type']!r}")
        return "gpt2"
    if not c.get("parallel_attn_mlp"):
        raise NotImplementedError("sequential LayerNorm + rotary is not supported (no matching HF class)")
    return "gptj" if c.get("rotary_adjacent_pairs") else "neox"


def _get(sd, key, default=None):
    v = sd.get(key)
    return default if v is None else v


def _kv(sd, l, name):
    """K/V weights/biases: GQA models store them under ``_W_K`` / ``_b_K``."""
    p = f"blocks.{l}.attn."
    return sd[p + "_" + name] if (p + "_" + name) in sd else sd[p + name]


def _ln(sd, key, d, rms=False):
    w = _get(sd, key + ".w", torch.ones(d))
    b = None if rms else _get(sd, key + ".b", torch.zeros(d))
    return w, b


def _to_gpt2(c, sd):
    import transformers as tf

    L, d, n, _ = c["n_layers"], c["d_model"], c["n_heads"], c["d_head"]
    config = tf.GPT2Config(
        vocab_size=c["d_vocab"], n_positions=c["n_ctx"], n_embd=d, n_layer=L, n_head=n,
        n_inner=c["d_mlp"], activation_function=c["act_fn"], layer_norm_epsilon=c.get("eps", 1e-5),
        scale_attn_by_inverse_layer_idx=bool(c.get("scale_attn_by_inverse_layer_idx")),
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    for l in range(L):
        p, q = f"blocks.{l}.", f"transformer.h.{l}."
        hf[q + "ln_1.weight"], hf[q + "ln_1.bias"] = _ln(sd, p + "ln1", d)
        hf[q + "ln_2.weight"], hf[q + "ln_2.bias"] = _ln(sd, p + "ln2", d)
        W = [sd[p + "attn.W_Q"], _kv(sd, l, "W_K"), _kv(sd, l, "W_V")]  # [n, d, h]
        B = [sd[p + "attn.b_Q"], _kv(sd, l, "b_K"), _kv(sd, l, "b_V")]  # [n, h]
        hf[q + "attn.c_attn.weight"] = torch.cat([rearrange(w, "n d h -> d (n h)") for w in W], dim=1)
        hf[q + "attn.c_attn.bias"] = torch.cat([rearrange(b, "n h -> (n h)") for b in B])
        hf[q + "attn.c_proj.weight"] = rearrange(sd[p + "attn.W_O"], "n h d -> (n h) d")  # Conv1D: [in, out]
        hf[q + "attn.c_proj.bias"] = sd[p + "attn.b_O"]
        hf[q + "mlp.c_fc.weight"] = sd[p + "mlp.W_in"]
        hf[q + "mlp.c_fc.bias"] = sd[p + "mlp.b_in"]
        hf[q + "mlp.c_proj.weight"] = sd[p + "mlp.W_out"]
        hf[q + "mlp.c_proj.bias"] = sd[p + "mlp.b_out"]
    hf["transformer.ln_f.weight"], hf["transformer.ln_f.bias"] = _ln(sd, "ln_final", d)
    return config, tf.GPT2LMHeadModel, hf


def _to_llama(c, sd):
    import transformers as tf

    L, d, n, h = c["n_layers"], c["d_model"], c["n_heads"], c["d_head"]
    nkv = c.get("n_key_value_heads") or n
    rotary_dim = c.get("rotary_dim") or h
    if rotary_dim != h:
        raise NotImplementedError("Llama shape needs rotary_dim == d_head")
    if c.get("rotary_adjacent_pairs"):
        raise NotImplementedError("Llama shape uses half-split rotary (rotary_adjacent_pairs=False)")
    config = tf.LlamaConfig(
        vocab_size=c["d_vocab"], max_position_embeddings=c["n_ctx"], hidden_size=d,
        intermediate_size=c["d_mlp"], num_hidden_layers=L, num_attention_heads=n,
        num_key_value_heads=nkv, head_dim=h, hidden_act=c["act_fn"],
        rms_norm_eps=c.get("eps", 1e-5), attention_bias=True, mlp_bias=True,
        tie_word_embeddings=False, rope_theta=float(c.get("rotary_base", 10000)),
    )  # type: ignore[call-arg]  # transformers 4.x's name, which 5.x still reads into rope_parameters
    # transformers>=5 keeps rope settings in rope_parameters
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = float(c.get("rotary_base", 10000))
        rp.setdefault("rope_type", "default")
    hf = {"model.embed_tokens.weight": sd["embed.W_E"], "model.norm.weight": _ln(sd, "ln_final", d, rms=True)[0]}
    for l in range(L):
        p, q = f"blocks.{l}.", f"model.layers.{l}."
        hf[q + "input_layernorm.weight"] = _ln(sd, p + "ln1", d, rms=True)[0]
        hf[q + "post_attention_layernorm.weight"] = _ln(sd, p + "ln2", d, rms=True)[0]
        a = q + "self_attn."
        hf[a + "q_proj.weight"] = rearrange(sd[p + "attn.W_Q"], "n d h -> (n h) d")
        hf[a + "q_proj.bias"] = rearrange(sd[p + "attn.b_Q"], "n h -> (n h)")
        for hn, tn in (("k_proj", "K"), ("v_proj", "V")):
            W, B = _kv(sd, l, f"W_{tn}"), _kv(sd, l, f"b_{tn}")
            if W.shape[0] != nkv:  # ungrouped storage: keep one copy per group
                W, B = W[:: n // nkv], B[:: n // nkv]
            hf[a + hn + ".weight"] = rearrange(W, "nkv d h -> (nkv h) d")
            hf[a + hn + ".bias"] = rearrange(B, "nkv h -> (nkv h)")
        hf[a + "o_proj.weight"] = rearrange(sd[p + "attn.W_O"], "n h d -> d (n h)")
        hf[a + "o_proj.bias"] = sd[p + "attn.b_O"]
        m = q + "mlp."
        hf[m + "gate_proj.weight"] = sd[p + "mlp.W_gate"].T
        hf[m + "gate_proj.bias"] = _get(sd, p + "mlp.b_gate", torch.zeros(c["d_mlp"]))
        hf[m + "up_proj.weight"] = sd[p + "mlp.W_in"].T
        # HookedTransformer's GatedMLP adds b_in AFTER the gate product:
        #   out = (act(x W_gate) * (x W_in) + b_in) W_out + b_out
        # so it is folded into the down-projection bias (exact; only the
        # mlp.hook_post activations differ from 3.x by the constant b_in).
        hf[m + "up_proj.bias"] = torch.zeros(c["d_mlp"])
        hf[m + "down_proj.weight"] = sd[p + "mlp.W_out"].T
        hf[m + "down_proj.bias"] = sd[p + "mlp.b_out"] + sd[p + "mlp.b_in"] @ sd[p + "mlp.W_out"]
    return config, tf.LlamaForCausalLM, hf


def _to_neox(c, sd):
    import transformers as tf

    L, d, n, h = c["n_layers"], c["d_model"], c["n_heads"], c["d_head"]
    rotary_dim = c.get("rotary_dim") or h
    config = tf.GPTNeoXConfig(
        vocab_size=c["d_vocab"], max_position_embeddings=c["n_ctx"], hidden_size=d,
        num_hidden_layers=L, num_attention_heads=n, intermediate_size=c["d_mlp"],
        hidden_act=c["act_fn"], layer_norm_eps=c.get("eps", 1e-5), use_parallel_residual=True,
        rotary_pct=rotary_dim / h, rotary_emb_base=float(c.get("rotary_base", 10000)),
        tie_word_embeddings=False, attention_bias=True, hidden_dropout=0.0, attention_dropout=0.0,
    )  # type: ignore[call-arg]  # transformers 4.x's rotary names, which 5.x still reads into rope_parameters
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = float(c.get("rotary_base", 10000))
        rp["partial_rotary_factor"] = rotary_dim / h
    hf = {"gpt_neox.embed_in.weight": sd["embed.W_E"]}
    for l in range(L):
        p, q = f"blocks.{l}.", f"gpt_neox.layers.{l}."
        hf[q + "input_layernorm.weight"], hf[q + "input_layernorm.bias"] = _ln(sd, p + "ln1", d)
        hf[q + "post_attention_layernorm.weight"], hf[q + "post_attention_layernorm.bias"] = _ln(sd, p + "ln2", d)
        W = torch.stack([sd[p + "attn.W_Q"], _kv(sd, l, "W_K"), _kv(sd, l, "W_V")], dim=1)  # [n,3,d,h]
        B = torch.stack([sd[p + "attn.b_Q"], _kv(sd, l, "b_K"), _kv(sd, l, "b_V")], dim=1)  # [n,3,h]
        hf[q + "attention.query_key_value.weight"] = rearrange(W, "n qkv d h -> (n qkv h) d")
        hf[q + "attention.query_key_value.bias"] = rearrange(B, "n qkv h -> (n qkv h)")
        hf[q + "attention.dense.weight"] = rearrange(sd[p + "attn.W_O"], "n h d -> d (n h)")
        hf[q + "attention.dense.bias"] = sd[p + "attn.b_O"]
        hf[q + "mlp.dense_h_to_4h.weight"] = sd[p + "mlp.W_in"].T
        hf[q + "mlp.dense_h_to_4h.bias"] = sd[p + "mlp.b_in"]
        hf[q + "mlp.dense_4h_to_h.weight"] = sd[p + "mlp.W_out"].T
        hf[q + "mlp.dense_4h_to_h.bias"] = sd[p + "mlp.b_out"]
    hf["gpt_neox.final_layer_norm.weight"], hf["gpt_neox.final_layer_norm.bias"] = _ln(sd, "ln_final", d)
    return config, tf.GPTNeoXForCausalLM, hf


_CONVERTERS = {"gpt2": _to_gpt2, "llama": _to_llama, "neox": _to_neox}


def _adjacent_to_half_split(c: dict, sd: dict) -> dict:
    h = c["d_head"]
    r = c.get("rotary_dim") or h
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2), torch.arange(r, h)])
    out = dict(sd)
    for l in range(c["n_layers"]):
        for name in ("W_Q", "W_K", "_W_K"):
            k = f"blocks.{l}.attn.{name}"
            if k in out:
                out[k] = out[k][..., perm]
        for name in ("b_Q", "b_K", "_b_K"):
            k = f"blocks.{l}.attn.{name}"
            if k in out:
                out[k] = out[k][..., perm]
    return out


def _head_name(hf_model) -> str:
    children = dict(hf_model.named_children())
    return "lm_head" if "lm_head" in children else "embed_out"


def with_unembed_bias(hf_model, b_U: torch.Tensor) -> str:
    """Give the Hugging Face causal LM ``hf_model`` the unembedding bias ``b_U``, in place.

    HF causal-LM heads have no bias; HookedTransformer has ``b_U``. Swaps in an ``nn.Linear`` with a
    bias (the bridge's unembed wraps whatever module sits at ``lm_head`` / ``embed_out``) and returns
    that attribute's name.
    """
    import torch.nn as nn

    name = _head_name(hf_model)
    old = getattr(hf_model, name)
    new = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        new.weight.copy_(old.weight)
        new.bias.copy_(b_U)
    setattr(hf_model, name, new)
    return name


def hooked_state_to_hf(cfg_dict: dict, state_dict: dict[str, torch.Tensor]):
    """Return ``(arch, hf_model)`` equivalent to the HookedTransformer weights."""
    c = dict(cfg_dict)
    _check_cfg(c)
    arch = _pick_arch(c)
    sd = {k: v.detach().to(torch.float32).cpu() for k, v in state_dict.items()}
    if arch == "gptj":
        # HF GPT-J shares one LayerNorm between attention and MLP and has no
        # attention biases, so it cannot hold a general 3.x parallel block.
        # Instead permute the rotary dims of Q/K from adjacent pairs to NeoX's
        # half-split layout (q.k is invariant under a joint permutation) and
        # use the NeoX class. hook_q / hook_k then come out in permuted order.
        sd = _adjacent_to_half_split(c, sd)
        arch = "neox"
    config, cls, hf_sd = _CONVERTERS[arch](c, sd)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        model = cls(config)
    head = _head_name(model)
    hf_sd[f"{head}.weight"] = sd["unembed.W_U"].T
    b_U = sd.get("unembed.b_U")
    if b_U is not None and bool(b_U.abs().max() > 0):
        with_unembed_bias(model, b_U)
    missing, unexpected = model.load_state_dict({k: v.contiguous() for k, v in hf_sd.items()}, strict=False)
    ignorable = ("rotary_emb.inv_freq", "attn.bias", "masked_bias", f"{head}.bias")
    missing = [k for k in missing if not k.endswith(ignorable)]
    if missing or unexpected:
        raise RuntimeError(f"weight conversion mismatch: missing={missing} unexpected={unexpected}")
    return arch, model.to(torch.float32).eval()


def bridge_from_hooked_state(cfg_dict: dict, state_dict: dict[str, torch.Tensor], tokenizer: Any = None) -> Any:
    """A ``TransformerBridge`` with the logits of a 3.x ``HookedTransformer`` (to ~1e-6 in float32).

    ``cfg_dict``: ``HookedTransformerConfig.to_dict()`` fields (its JSON form is fine).
    ``state_dict``: ``HookedTransformer.state_dict()`` (3.x key names; buffers such as ``attn.mask``
    or ``rotary_sin`` are ignored). ``tokenizer``: a Hugging Face tokenizer; ``None`` attaches a
    placeholder word-level tokenizer of ``d_vocab`` ids (``<bos>`` = 0). The bridge is returned
    without ``enable_compatibility_mode()``, so its hooks see the same (unfolded) weights as the
    3.x model did; ``cfg.default_prepend_bos`` is copied from ``cfg_dict``.

    Supported shapes: GPT-2 (LayerNorm, learned positions), GPT-NeoX and GPT-J (parallel attention
    and MLP, rotary on part of each head, half-split or adjacent pairs), Llama (RMSNorm, rotary,
    gated MLP, grouped-query attention). Other options raise ``NotImplementedError`` naming them.
    GPT-J-shaped weights are stored in the NeoX class with the rotary dimensions of ``W_Q``/``W_K``
    permuted (``q . k`` is unchanged): ``hook_q``/``hook_k`` come out permuted, everything else equal.
    """
    arch, hf_model = hooked_state_to_hf(cfg_dict, state_dict)
    if tokenizer is None:
        tokenizer = make_word_tokenizer(int(cfg_dict["d_vocab"]))
    bridge = boot(hf_model, arch, tokenizer)
    bridge.cfg.default_prepend_bos = bool(cfg_dict.get("default_prepend_bos", True))
    return bridge


def bridge_from_hooked(model: Any, tokenizer: Any = None) -> Any:
    """The ``TransformerBridge`` twin of a live 3.x ``HookedTransformer`` (same weights and logits).

    Uses ``model.tokenizer`` unless ``tokenizer`` is given (see :func:`bridge_from_hooked_state`).
    Raises ``TypeError`` for anything else (a bridge already is one: use it as it is).
    """
    if is_bridge(model) or not hasattr(model, "cfg") or not hasattr(model.cfg, "to_dict"):
        raise TypeError(f"bridge_from_hooked needs a HookedTransformer, got {type(model).__name__}"
                        + (": it already is a TransformerBridge, use it as it is" if is_bridge(model) else ""))
    return bridge_from_hooked_state(
        model.cfg.to_dict(), model.state_dict(), tokenizer if tokenizer is not None else model.tokenizer
    )
