"""Tiny random Hugging Face causal LMs wrapped as ``TransformerBridge`` (the 4.x loading route).

Unlike the suite's ``build_bridge`` (HookedTransformer weights converted to GPT-2 / NeoX / Llama
classes), these use each architecture's own Hugging Face class, including ``GPTJForCausalLM``, whose
attention the bridge only observes. Built offline with a local word-level tokenizer.
"""

from __future__ import annotations

import torch

from interventions.backends.bridge import boot
from interventions.convert import ARCHES
from interventions.tokenization import make_word_tokenizer


def _hf_config(arch: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int | None, d_vocab: int,
               n_ctx: int, d_mlp: int):
    import transformers as tf

    if arch == "gpt2":
        return tf.GPT2Config(
            vocab_size=d_vocab, n_positions=n_ctx, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
            n_inner=d_mlp, activation_function="gelu_new", tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None,
        ), tf.GPT2LMHeadModel
    if arch == "neox":
        return tf.GPTNeoXConfig(
            vocab_size=d_vocab, max_position_embeddings=n_ctx, hidden_size=d_model,
            num_hidden_layers=n_layers, num_attention_heads=n_heads, intermediate_size=d_mlp,
            rotary_pct=0.5, use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False,
        ), tf.GPTNeoXForCausalLM
    if arch == "gptj":
        return tf.GPTJConfig(
            vocab_size=d_vocab, n_positions=n_ctx, n_embd=d_model, n_layer=n_layers, n_head=n_heads,
            n_inner=d_mlp, rotary_dim=max(2, d_model // n_heads // 2), tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None,
        ), tf.GPTJForCausalLM
    return tf.LlamaConfig(
        vocab_size=d_vocab, max_position_embeddings=n_ctx, hidden_size=d_model,
        num_hidden_layers=n_layers, num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads or n_heads, intermediate_size=d_mlp,
        head_dim=d_model // n_heads, tie_word_embeddings=False,
    ), tf.LlamaForCausalLM


def build_hf_bridge(arch: str, n_layers: int = 2, d_model: int = 32, n_heads: int = 4,
                    n_kv_heads: int | None = None, d_vocab: int = 50, seed: int = 0, n_ctx: int = 64):
    """Random ``arch`` model of its own Hugging Face class as a bridge; ``n_kv_heads`` only for llama."""
    if arch not in ARCHES:
        raise ValueError(f"arch={arch!r} is not valid: choose one of {ARCHES}")
    d_mlp = 2 * d_model if arch == "llama" else 4 * d_model
    config, cls = _hf_config(arch, n_layers, d_model, n_heads, n_kv_heads, d_vocab, n_ctx, d_mlp)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf = cls(config)
    return boot(hf.to(torch.float32), arch, make_word_tokenizer(d_vocab))
