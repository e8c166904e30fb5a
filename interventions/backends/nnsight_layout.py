"""Where the parts the interventions touch live inside a Hugging Face causal LM (for the nnsight backend).

The nnsight backend addresses modules by their attribute paths (the same on the local model and on an
NDIF server): the decoder blocks (the ``nn.ModuleList`` holding ``num_hidden_layers`` blocks), each
block's attention module and that attention's output projection, whose *input* is the per-head
attention output (``hook_z``, ``[batch, pos, n_heads * d_head]``). :func:`layout_of` finds them by name
for every family the toolkit tests (GPT-2, GPT-J, GPT-NeoX/Pythia, Llama, Qwen2, Gemma, Mistral);
:func:`config_of` reads the shapes from the Hugging Face config with TransformerLens's field names, so
``model.cfg`` reads the same on every backend. No nnsight import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from ..errors import InterventionError
from ..types import Tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ATTENTION_NAMES = ("self_attn", "attn", "attention")
MID_NORM_NAMES = ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2")
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm")
OUTPUT_PROJECTION_NAMES = ("o_proj", "c_proj", "dense", "out_proj")
IN_NORM_NAMES = ("input_layernorm", "ln_1")
QKV_NAMES = (("q_proj", "k_proj", "v_proj"), ("c_attn",))
"""The query, key and value projections of an attention module: three modules, or GPT-2's one fused module."""
MLP_NAMES = ("mlp",)
ROTARY_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gpt_neox", "gptj", "phi3", "olmo")


@dataclass(frozen=True)
class Layout:
    """Attribute paths (dotted, from the causal LM) of the parts the interventions use.

    ``blocks``: the decoder blocks (index ``l`` is block ``l``, 0-indexed); ``attention``: a block's
    attention module, relative to the block; ``out_proj``: the attention's output projection, relative
    to the block; ``mid_norm``: the norm before the MLP, relative to the block (``None`` for parallel
    blocks, whose MLP reads the block's input); ``embed``: the token embedding; ``head``: the unembedding
    (``lm_head``); ``final_norm``: the norm before it (``None`` if there is none). For split inputs
    (:mod:`.nnsight_split`), relative to the block: ``in_norm``, the norm before attention; ``qkv``, the query,
    key and value projections (one path when fused); ``mlp``, the MLP (each empty where not found)."""

    blocks: str
    attention: str
    out_proj: str
    mid_norm: str | None
    embed: str
    head: str
    final_norm: str | None
    in_norm: str | None = None
    qkv: tuple[str, ...] = ()
    mlp: str | None = None


def child_named(module: torch.nn.Module, names: tuple[str, ...], what: str) -> str:
    """The name of the first child of ``module`` called one of ``names``; ``ValueError`` otherwise."""
    children = dict(module.named_children())
    for name in names:
        if name in children:
            return name
    raise InterventionError(f"cannot find the {what} of {type(module).__name__} (children: {', '.join(children)}): "
                            f"the nnsight backend knows modules named {', '.join(names)}")


def layout_of(hf_model: PreTrainedModel) -> Layout:
    """The :class:`Layout` of the Hugging Face causal LM ``hf_model`` (found by module names)."""
    n_layers = int(text_config(hf_model.config).num_hidden_layers)
    blocks = next((name for name, m in hf_model.named_modules()
                   if isinstance(m, torch.nn.ModuleList) and len(m) == n_layers), None)
    if blocks is None:
        raise InterventionError(f"cannot find the {n_layers} decoder blocks of {type(hf_model).__name__}: the nnsight "
                                f"backend needs them as one nn.ModuleList")
    block = cast(torch.nn.ModuleList, hf_model.get_submodule(blocks))[0]  # found as a ModuleList above
    attention = child_named(block, ATTENTION_NAMES, "attention")
    out_proj = child_named(block.get_submodule(attention), OUTPUT_PROJECTION_NAMES, "attention output projection")
    embed = next(name for name, m in hf_model.named_modules() if m is hf_model.get_input_embeddings())
    head = next(name for name, m in hf_model.named_modules() if m is hf_model.get_output_embeddings())
    parallel = bool(getattr(text_config(hf_model.config), "use_parallel_residual", False)) or \
        text_config(hf_model.config).model_type == "gptj"
    children = dict(block.named_children())
    mid = None if parallel else next((n for n in MID_NORM_NAMES if n in children), None)
    base = hf_model.get_submodule(blocks.rsplit(".", 1)[0]) if "." in blocks else hf_model
    final = next((n for n in FINAL_NORM_NAMES if n in dict(base.named_children())), None)
    prefix = blocks.rsplit(".", 1)[0] + "." if "." in blocks else ""
    in_norm = next((n for n in IN_NORM_NAMES if n in children), None)
    mlp = next((n for n in MLP_NAMES if n in children), None)
    projections = dict(block.get_submodule(attention).named_children())
    qkv = next((names for names in QKV_NAMES if all(n in projections for n in names)), ())
    return Layout(blocks=blocks, attention=attention, out_proj=f"{attention}.{out_proj}", mid_norm=mid, embed=embed,
                  head=head, final_norm=None if final is None else prefix + final, in_norm=in_norm,
                  qkv=tuple(f"{attention}.{n}" for n in qkv), mlp=mlp)


def text_config(config: Any) -> Any:
    """The text part of a Hugging Face config (the config itself for a plain causal LM)."""
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


@dataclass
class NNsightConfig:
    """A model's shapes under TransformerLens's names (what ``model.cfg`` offers on the other backends).

    Counts are plain integers; ``positional_embedding_type`` is ``"rotary"`` or ``"standard"`` (learned
    absolute positions); ``default_prepend_bos`` says whether prompts get BOS by default."""

    model_name: str
    n_layers: int
    n_heads: int
    n_key_value_heads: int | None
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    parallel_attn_mlp: bool
    positional_embedding_type: str
    default_prepend_bos: bool
    attn_implementation: str
    device: Any = None
    dtype: Any = None
    original_architecture: str = ""
    use_split_qkv_input: bool = False
    """Whether the split query/key/value inputs are emulated (``hook_q_input`` ...), as on TransformerLens."""
    use_hook_mlp_in: bool = False
    """Whether ``hook_mlp_in`` is emulated, as on TransformerLens."""


def config_of(hf_config: Any, name: str, tokenizer: Tokenizer) -> NNsightConfig:
    """:class:`NNsightConfig` from a Hugging Face config (``hf_config``), the model's ``name`` and tokenizer."""
    c = text_config(hf_config)
    n_heads = int(c.num_attention_heads)
    d_model = int(c.hidden_size)
    d_head = int(getattr(c, "head_dim", None) or d_model // n_heads)
    kv = getattr(c, "num_key_value_heads", None)
    model_type = str(getattr(c, "model_type", ""))
    parallel = bool(getattr(c, "use_parallel_residual", model_type == "gptj"))
    has_bos = getattr(tokenizer, "bos_token_id", None) is not None and model_type not in ("gpt_neox", "qwen2")
    n_ctx = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 2048
    return NNsightConfig(
        model_name=name,
        n_layers=int(c.num_hidden_layers),
        n_heads=n_heads,
        n_key_value_heads=int(kv) if kv is not None and int(kv) != n_heads else None,
        d_model=d_model,
        d_head=d_head,
        d_vocab=int(c.vocab_size),
        n_ctx=int(n_ctx),
        parallel_attn_mlp=parallel,
        positional_embedding_type="rotary" if model_type in ROTARY_TYPES else "standard",
        default_prepend_bos=has_bos,
        attn_implementation=str(getattr(hf_config, "_attn_implementation", None) or "eager"),
        original_architecture=(list(getattr(hf_config, "architectures", None) or [""]) + [""])[0],
    )
