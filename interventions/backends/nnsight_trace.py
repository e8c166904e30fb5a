"""The body of every nnsight trace of the toolkit: hook points emulated on a Hugging Face causal LM.

One trace holds one or more *invokes* (:class:`Invoke`): token ids ``[batch, pos]`` (every invoke of
a trace has the same ``pos``), the hook functions of that invoke by hook name, the hook names whose
activations to return, and whether to return logits (``"all"`` positions, the ``"last"`` one, or
``"none"``). Per block ``l`` (0-indexed), in the order the forward pass reaches them:

* ``blocks.{l}.hook_resid_pre``: the block's input hidden states ``[batch, pos, d_model]``;
* ``blocks.{l}.attn.hook_attn_mask``: the boolean ``[query_pos, key_pos]`` mask of the keys each query
  may attend to (causal to begin with); a hook may return ``[n_heads, query_pos, key_pos]`` (one mask per
  query head). If a hook changes it, the attention module gets it as its ``attention_mask`` (additive: 0
  allowed, the dtype's minimum elsewhere, ``[batch, 1, q, k]``, or ``[batch, n_heads, q, k]``), which eager
  and SDPA attention honour alike. The invokes of one trace join their masks into one batch, so a trace
  whose masks are per head holds one invoke (:meth:`~.nnsight.NNsightAdapter.run_configs` splits);
* ``blocks.{l}.hook_q_input``, ``hook_k_input``, ``hook_v_input`` (with split inputs: a
  :class:`~.nnsight_split.SplitBlock` per block is given): one copy of the block's input per query head
  ``[batch, pos, n_heads, d_model]`` and per key/value head ``[batch, pos, n_kv_heads, d_model]``, before the
  norm; what the hooks return is normed and projected per head into the projections' outputs;
* ``blocks.{l}.attn.hook_z``: the input of the attention output projection, viewed per query head
  ``[batch, pos, n_heads, d_head]``;
* ``blocks.{l}.hook_attn_out``: the attention module's output (what is added to the residual stream);
* ``blocks.{l}.hook_resid_mid`` (sequential blocks; read-only): the input of the norm before the MLP;
* ``blocks.{l}.hook_mlp_in`` (with split inputs): the same stream as the MLP's own input (an edit reaches
  the MLP alone, not the residual stream);
* ``blocks.{l}.hook_mlp_out``: the MLP's output;
* ``blocks.{l}.hook_resid_post``: the block's output hidden states.

A hook is ``fn(activation, hook)`` returning ``None`` (observe) or the replacement, as on
TransformerLens. Only points with hooks, reads or sums are touched. :func:`run_trace` returns, per
invoke, the activations read (or their sums over the batch), the logits asked for and the names of the
points whose hooks ran; nothing else comes back from a remote run. This module never imports nnsight: the model
wrapper passes the trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import einops
import torch
from jaxtyping import Float

from ..errors import InterventionError
from ..readout import answer_positions, answer_readout
from .nnsight_layout import Layout
from .nnsight_split import SplitBlock

if TYPE_CHECKING:
    from nnsight import LanguageModel

LOGITS = ("all", "last", "answer", "none")
POINT_KINDS = ("hook_resid_pre", "attn.hook_attn_mask", "hook_q_input", "hook_k_input", "hook_v_input",
               "attn.hook_z", "hook_attn_out", "hook_resid_mid", "hook_mlp_in", "hook_mlp_out", "hook_resid_post")
"""The emulated hook points of each block, in the order a forward pass reaches them."""


@dataclass
class Invoke:
    """One invoke of a trace: ``tokens`` ``[batch, pos]``, ``hooks`` (hook name -> functions, run in
    order), ``reads`` (hook names whose activation, after the hooks, is returned), ``sums`` (hook names
    whose activation summed over the batch is returned) and ``logits`` (one of :data:`LOGITS`;
    ``"answer"``: :func:`~interventions.readout.answer_readout` of the last position for ``answers``)."""

    tokens: torch.Tensor
    hooks: dict[str, list[Callable[..., Any]]] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()
    logits: str = "all"
    answers: torch.Tensor | None = None
    rows: tuple[int, int, int] = (0, 0, 0)
    """``(first row, rows, rows of the whole trace)`` of this invoke in the trace's batch (set by :func:`run_trace`)."""


class HookInfo:
    """What a hook function gets as its second argument: the hook point's ``name``."""

    def __init__(self, name: str):
        self.name = name


def envoy_at(root: Any, path: str) -> Any:
    """The envoy (or module) at dotted attribute path ``path`` below ``root``."""
    out = root
    for part in path.split("."):
        out = getattr(out, part)
    return out


def call_hooks(name: str, act: torch.Tensor, fns: list[Callable[..., Any]]) -> torch.Tensor:
    """``act`` after every function in ``fns`` (each sees the previous one's result; ``None`` keeps it)."""
    info = HookInfo(name)
    for fn in fns:
        out = fn(act, info)
        if out is not None:
            act = out
    return act


def mask_like(allowed: torch.Tensor, current: Any, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, q, k]`` attention mask of the boolean ``allowed`` ``[q, k]`` (``[1, n_heads, q, k]`` of one
    ``[n_heads, q, k]``) in the form of the model's own mask ``current``: boolean (True = attend) if that is
    boolean, else additive, 0 where allowed and the smallest value of the dtype elsewhere (what Hugging Face's
    own causal masks hold; ``dtype`` when the model passes no mask)."""
    allowed = allowed.reshape(1, -1, *allowed.shape[-2:])
    if isinstance(current, torch.Tensor) and current.dtype == torch.bool:
        return allowed
    if isinstance(current, torch.Tensor) and current.is_floating_point():
        dtype = current.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


def batch_mask(allowed: torch.Tensor, causal: torch.Tensor, current: Any, hidden: torch.Tensor,
               rows: tuple[int, int, int]) -> torch.Tensor:
    """The attention mask to give a block's attention in one invoke: ``allowed`` for this invoke's rows.

    The invokes of a trace are rows of one batch. A mask nnsight already narrowed to this invoke's rows
    (a batched tensor) gets this invoke's rows only; otherwise (no mask, as with SDPA's causal kernel, or
    one shared by every row) the whole batch gets one, causal in the other invokes' rows, which they
    then narrow and edit in turn."""
    first, size, total = rows
    ours = mask_like(allowed.to(hidden.device), current, hidden.dtype).expand(size, -1, -1, -1)
    if getattr(current, "_nnsight_batch", False) or total == size:
        return ours
    others = mask_like(causal.to(hidden.device), current, hidden.dtype).expand(total, ours.shape[1], -1, -1)
    return torch.cat([others[:first], ours, others[first + size:]])


def at_point(name: str, value: torch.Tensor, inv: Invoke, out: dict[str, Any], visited: list[str]) -> torch.Tensor:
    """``value`` after ``inv``'s hooks at hook point ``name`` (recorded in ``visited``); saved into ``out`` if
    ``name`` is read."""
    if name in inv.hooks:
        value = call_hooks(name, value, inv.hooks[name])
        visited.append(name)
    if name in inv.reads:
        out[name] = value.save()  # type: ignore[attr-defined]  # an nnsight proxy of the tensor: it has .save()
    if name in inv.sums:
        # float64, as MeanCache accumulates; an nnsight proxy of the tensor: it has .save().
        out[name] = value.double().sum(0).save()  # type: ignore[attr-defined]
    return value


def first_of(output: Any) -> torch.Tensor:
    """The hidden states of a module output (a tensor, or a tuple whose first element they are)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def with_first(output: Any, new: torch.Tensor) -> Any:
    """``output`` with its hidden states replaced by ``new``."""
    return new if isinstance(output, torch.Tensor) else (new, *output[1:])


def visit_block(block: Any, layout: Layout, l: int, n_heads: int, inv: Invoke, out: dict[str, Any],
                visited: list[str], split: SplitBlock | None = None) -> None:
    """Apply ``inv``'s hooks and reads at the hook points of block ``l`` (see the module docstring), in the
    order the forward pass reaches them; ``split``: the block's split inputs (``None``: not emulated)."""
    names = {kind: f"blocks.{l}.{kind}" for kind in POINT_KINDS}
    wanted = {k for k, n in names.items() if n in inv.hooks or n in inv.reads or n in inv.sums}
    pre, mask, z, attn, mid, post = (names[k] for k in ("hook_resid_pre", "attn.hook_attn_mask", "attn.hook_z",
                                                         "hook_attn_out", "hook_resid_mid", "hook_resid_post"))
    qkv = [k for k in ("hook_q_input", "hook_k_input", "hook_v_input") if k in wanted]
    x = None
    if "hook_resid_pre" in wanted or (qkv and split is not None):  # read before anything later in the block
        x = block.input
        new = at_point(pre, x, inv, out, visited) if "hook_resid_pre" in wanted else x
        if new is not x:
            block.input = x = new
    if "attn.hook_attn_mask" in wanted:
        attention = envoy_at(block, layout.attention)
        args, kwargs = attention.inputs
        n = inv.tokens.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=inv.tokens.device).tril()
        allowed = call_hooks(mask, causal, inv.hooks.get(mask, []))
        visited.append(mask)
        if allowed.shape != causal.shape or not torch.equal(allowed, causal):
            hidden = args[0] if args else kwargs["hidden_states"]
            new = batch_mask(allowed, causal, kwargs.get("attention_mask"), hidden, inv.rows)
            attention.inputs = (args, {**kwargs, "attention_mask": new})
        if mask in inv.reads:
            out[mask] = allowed
    if qkv and split is not None and x is not None:
        split_qkv(block, split, l, x, inv, out, visited)
    if "attn.hook_z" in wanted:
        proj = envoy_at(block, layout.out_proj)
        flat = proj.input
        heads = einops.rearrange(flat, "... pos (n_heads d_head) -> ... pos n_heads d_head", n_heads=n_heads)
        new = at_point(z, heads, inv, out, visited)
        if new is not heads:
            proj.input = einops.rearrange(new, "... pos n_heads d_head -> ... pos (n_heads d_head)")
    if "hook_attn_out" in wanted:
        attention = envoy_at(block, layout.attention)
        output = attention.output
        new = at_point(attn, first_of(output), inv, out, visited)
        if new is not first_of(output):
            attention.output = with_first(output, new)
    mlp_in = "hook_mlp_in" in wanted and split is not None
    if "hook_resid_mid" in wanted or mlp_in:
        if layout.mid_norm is None:
            raise InterventionError(f"{mid} does not exist in parallel blocks (attention and MLP read the same input)")
        norm = envoy_at(block, layout.mid_norm)
        x = norm.input
        if "hook_resid_mid" in wanted and at_point(mid, x, inv, out, visited) is not x:
            raise InterventionError(f"{mid} is read-only on the nnsight backend (it is the input of the MLP's "
                                    "norm, not the residual stream): edit hook_mlp_in (split inputs), "
                                    "hook_attn_out or hook_resid_post instead")
        if mlp_in:
            new = at_point(names["hook_mlp_in"], x, inv, out, visited)
            if new is not x:
                norm.input = new
    if "hook_mlp_out" in wanted:
        if layout.mlp is None:
            raise InterventionError(f"{names['hook_mlp_out']}: the nnsight backend found no module named "
                                    f"'mlp' in block {l}")
        mlp = envoy_at(block, layout.mlp)
        output = mlp.output
        new = at_point(names["hook_mlp_out"], first_of(output), inv, out, visited)
        if new is not first_of(output):
            mlp.output = with_first(output, new)
    if "hook_resid_post" in wanted:
        output = block.output
        new = at_point(post, first_of(output), inv, out, visited)
        if new is not first_of(output):
            block.output = with_first(output, new)


def split_qkv(block: Any, split: SplitBlock, l: int, x: Float[torch.Tensor, "batch pos d_model"], inv: Invoke,
              out: dict[str, Any], visited: list[str]) -> None:
    """The split query, key and value inputs of block ``l``: a copy of ``x`` (the block's input
    ``[batch, pos, d_model]``) per head through the hooks, then normed and projected per head into the
    projections' outputs (left as they are when no hook changed a copy)."""
    projections = (split.q, split.k, split.v)
    inputs, changed = [], False
    for kind, proj in zip("qkv", projections):
        copy = x[..., None, :].expand(*x.shape[:-1], proj.weight.shape[0], x.shape[-1])
        new = at_point(f"blocks.{l}.hook_{kind}_input", copy, inv, out, visited)
        changed = changed or new is not copy
        inputs.append(new)
    if not changed:  # hooks that only read: the model's own projections stand, nothing is recomputed
        return
    projected = [proj(split.norm(new)) for proj, new in zip(projections, inputs)]
    if split.fused:
        envoy_at(block, split.paths[0]).output = torch.cat(projected, dim=-1)
        return
    for path, value in zip(split.paths, projected):
        envoy_at(block, path).output = value


def visit(lm: LanguageModel, layout: Layout, n_layers: int, n_heads: int, inv: Invoke,
          split: list[SplitBlock] | None = None) -> dict[str, Any]:
    """Everything one invoke does inside the trace; returns its saved results (see :func:`run_trace`)."""
    out: dict[str, Any] = {}
    visited: list[str] = []
    blocks = envoy_at(lm, layout.blocks)
    for l in range(n_layers):
        visit_block(blocks[l], layout, l, n_heads, inv, out, visited, None if split is None else split[l])
    if inv.logits != "none":
        logits = envoy_at(lm, layout.head).output
        if inv.logits == "answer":
            assert inv.answers is not None  # NNsightAdapter passes answers with logits="answer"
            readout = answer_readout(answer_positions(logits, inv.answers), inv.answers)
            out["logits"] = readout.save()  # type: ignore[attr-defined]  # an nnsight proxy: it has .save()
        else:
            out["logits"] = (logits[:, -1:] if inv.logits == "last" else logits).save()
    out["visited"] = visited
    return out


def run_trace(lm: LanguageModel, layout: Layout, n_layers: int, n_heads: int, invokes: list[Invoke],
              trace_kwargs: dict[str, Any], split: list[SplitBlock] | None = None) -> list[dict[str, Any]]:
    """Run ``invokes`` in one nnsight trace of ``lm`` (``trace_kwargs`` go to ``lm.trace``, e.g.
    ``remote=True``; ``split``: every block's split inputs, or ``None`` where they are not emulated). Per invoke:
    ``{hook name: activation}`` for its reads, ``"logits"`` unless ``logits="none"`` (``[batch, pos or 1,
    d_vocab]``) and ``"visited"`` (the hook names whose hooks ran)."""
    from nnsight import save

    total, first = sum(int(inv.tokens.shape[0]) for inv in invokes), 0
    for inv in invokes:
        inv.rows = (first, int(inv.tokens.shape[0]), total)
        first += inv.rows[1]
    with lm.trace(**trace_kwargs) as tracer:
        results = save([])
        for inv in invokes:
            with tracer.invoke(inv.tokens):
                results.append(visit(lm, layout, n_layers, n_heads, inv, split))
    return list(results)
