"""Split inputs on a Hugging Face block, for the nnsight backend: one input per query head, key/value head and MLP.

TransformerLens computes, when asked (``use_split_qkv_input``, ``use_hook_mlp_in``), one copy of the residual
stream per query head (``hook_q_input``, ``[batch, pos, n_heads, d_model]``), per **key/value head**
(``hook_k_input`` / ``hook_v_input``, ``[batch, pos, n_kv_heads, d_model]``) and for the MLP (``hook_mlp_in``),
each before the block's norm, so that an edit there reaches that one receiver (:mod:`interventions.parts`).
A Hugging Face block has one normed input shared by every head. :class:`SplitBlock` holds what is needed to
emulate the split on block ``l``: a functional copy of the block's first norm and each head's slice of the
query, key and value projections. The trace (:mod:`.nnsight_trace`) gives each head its own copy of the block's
input, lets the hooks edit it, norms every copy and writes each head's projection into the projections' outputs
(``q_proj``/``k_proj``/``v_proj``, or GPT-2's fused ``c_attn``); the MLP input is the input of the norm before
the MLP. Rotary embeddings, the attention and everything after run as the model's own code.

Blocks of a norm, attention, a norm and an MLP in sequence are supported (GPT-2, Llama, Qwen2, Mistral), with
LayerNorm or RMSNorm; :func:`split_blocks` refuses others in one line, and checks once, on random input, that
its copy of each norm equals the module. Gradients flow through the emulation like through the model. No
nnsight import here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float

from ..errors import InterventionError
from .nnsight_layout import Layout, NNsightConfig

__all__ = ["SplitBlock", "head_out_weights", "norm_function", "split_blocks"]

Norm = Callable[[torch.Tensor], torch.Tensor]

NORM_CHECK_ATOL = 1e-5
"""Largest difference (float32 units of the normed stream) allowed between a norm module and its copy."""


def norm_function(module: torch.nn.Module) -> Norm:
    """A functional copy of ``module`` (``torch.nn.LayerNorm``, or an RMSNorm with ``weight`` and
    ``variance_epsilon``/``eps`` as Llama's, Qwen2's and Mistral's): the same result on any leading shape, without
    calling the module (a call inside a trace would count as one of the model's own calls)."""
    if isinstance(module, torch.nn.LayerNorm):
        ln = module
        return lambda x: torch.nn.functional.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if "RMSNorm" not in type(module).__name__ or not isinstance(weight, torch.Tensor) or eps is None:
        raise InterventionError(f"the nnsight backend splits block inputs only for LayerNorm and RMSNorm, not "
                                f"{type(module).__name__}: use --backend bridge")

    def rms(x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + float(eps))
        return weight * h.to(x.dtype)

    return rms


def check_norm(module: torch.nn.Module, norm: Norm, where: str) -> None:
    """Refuse (one line) a copy ``norm`` that differs from ``module`` on a random input (a norm of another form
    under a known class name, such as Gemma's ``1 + weight``)."""
    p = next(module.parameters())
    x = torch.randn(2, 3, p.shape[-1], generator=torch.Generator().manual_seed(0)).to(p.device, p.dtype)
    with torch.no_grad():
        gap = float((module(x) - norm(x)).abs().max())
    if not gap <= NORM_CHECK_ATOL:
        raise InterventionError(f"{where} ({type(module).__name__}) is not a plain LayerNorm or RMSNorm (its copy "
                                f"differs by {gap:.2g}): the nnsight backend cannot split its inputs; use --backend "
                                "bridge")


def projection_matrix(module: torch.nn.Module) -> tuple[Float[torch.Tensor, "d_in d_out"],
                                                        Float[torch.Tensor, " d_out"] | None]:
    """``(W [d_in, d_out], b [d_out] or None)`` of a ``torch.nn.Linear`` or a GPT-2 ``Conv1D`` (``x @ W + b``)."""
    if isinstance(module, torch.nn.Linear):
        return module.weight.T, module.bias
    if type(module).__name__ == "Conv1D":
        weight = module.weight
        bias = module.bias
        assert isinstance(weight, torch.Tensor)  # Conv1D's parameters
        return weight, bias if isinstance(bias, torch.Tensor) else None
    raise InterventionError(f"the nnsight backend splits block inputs only through Linear or Conv1D projections, "
                            f"not {type(module).__name__}: use --backend bridge")


@dataclass(frozen=True)
class HeadProjection:
    """One head-split projection: ``weight`` ``[heads, d_model, d_head]``, ``bias`` ``[heads, d_head]`` or None."""

    weight: Float[torch.Tensor, "heads d_model d_head"]
    bias: Float[torch.Tensor, "heads d_head"] | None

    def __call__(self, x: Float[torch.Tensor, "*batch pos heads d_model"]
                 ) -> Float[torch.Tensor, "*batch pos heads_d_head"]:
        """Each head's input through that head's slice, flattened as the projection's output (heads, then
        ``d_head``)."""
        out = torch.einsum("...hm,hmd->...hd", x, self.weight.to(x.dtype))
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.flatten(-2)


@dataclass(frozen=True)
class SplitBlock:
    """What splitting block ``l``'s inputs needs: the first norm's copy, and the query, key and value
    projections per head (``fused``: one projection module, GPT-2's ``c_attn``, gives all three concatenated)."""

    norm: Norm
    q: HeadProjection
    k: HeadProjection
    v: HeadProjection
    paths: tuple[str, ...]
    """The projection modules, relative to the block: ``(q, k, v)`` or the one fused module."""

    @property
    def fused(self) -> bool:
        return len(self.paths) == 1


def heads_of(weight: Float[torch.Tensor, "d_model n_d_head"], bias: Float[torch.Tensor, " n_d_head"] | None, n: int,
             d_head: int) -> HeadProjection:
    """``W [d_model, n * d_head]`` and its bias as :class:`HeadProjection` of ``n`` heads."""
    w = weight.reshape(weight.shape[0], n, d_head).permute(1, 0, 2)
    return HeadProjection(w, None if bias is None else bias.reshape(n, d_head))


def split_block(block: torch.nn.Module, layout: Layout, cfg: NNsightConfig, l: int) -> SplitBlock:
    """The :class:`SplitBlock` of decoder block ``l`` (``block``, the Hugging Face module); one-line refusals
    for blocks the emulation does not cover (see the module docstring)."""
    name = type(block).__name__
    if cfg.parallel_attn_mlp or layout.mid_norm is None or layout.in_norm is None or layout.mlp is None \
            or not layout.qkv:
        raise InterventionError(f"the nnsight backend splits block inputs only in blocks of a norm, attention, a "
                                f"norm and an MLP in sequence (GPT-2, Llama, Qwen2, Mistral), not {name}: use "
                                "--backend bridge")
    extra = sorted(set(dict(block.named_children())) - {layout.attention, layout.mlp, layout.in_norm,
                                                         layout.mid_norm} - {n for n, m in block.named_children()
                                                                             if isinstance(m, torch.nn.Dropout)})
    if extra:
        raise InterventionError(f"{name} has parts besides its two norms, attention and MLP ({', '.join(extra)}): "
                                "the nnsight backend cannot split its inputs; use --backend bridge")
    in_norm = block.get_submodule(layout.in_norm)
    norm = norm_function(in_norm)
    if l == 0:
        check_norm(in_norm, norm, f"block 0's {layout.in_norm}")
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    widths = (cfg.n_heads, n_kv, n_kv)
    mats = [projection_matrix(block.get_submodule(p)) for p in layout.qkv]
    if len(mats) == 1:  # fused q | k | v along the output
        w, b = mats[0]
        cuts = [h * cfg.d_head for h in widths]
        ws = torch.split(w, cuts, dim=1)
        bs = torch.split(b, cuts) if b is not None else (None, None, None)
        mats = list(zip(ws, bs))
    q, k, v = (heads_of(w, b, n, cfg.d_head) for (w, b), n in zip(mats, widths))
    return SplitBlock(norm=norm, q=q, k=k, v=v, paths=layout.qkv)


def split_blocks(blocks: torch.nn.Module, layout: Layout, cfg: NNsightConfig) -> list[SplitBlock]:
    """:func:`split_block` of every decoder block (``blocks``: the ``nn.ModuleList`` of them; 0-indexed)."""
    return [split_block(block, layout, cfg, l) for l, block in enumerate(blocks.children())]


def head_out_weights(blocks: torch.nn.Module, layout: Layout, cfg: NNsightConfig
                     ) -> Float[torch.Tensor, "n_layers n_heads d_head d_model"]:
    """``W_O`` of every block as TransformerLens holds it: head ``h`` of block ``l`` writes
    ``z[..., h, :] @ W_O[l, h]`` into the residual stream (the projection's bias ``b_O`` is not a head's)."""
    out = []
    for block in blocks.children():
        w, _ = projection_matrix(block.get_submodule(layout.out_proj))
        out.append(w.reshape(cfg.n_heads, cfg.d_head, w.shape[-1]))
    return torch.stack(out)
