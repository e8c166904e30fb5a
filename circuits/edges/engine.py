"""One forward pass over the edge graph: every receiver reads its own copy of the residual stream.

Position-aware key and value edges need the key (value) at position ``p`` as each query position ``q``
reads it. The pass runs each prompt ``n_pos`` times (copy ``c`` is the prompt as query position ``c`` sees
it): copy ``c``'s key and value inputs carry what position ``c`` reads, and after attention every copy gets
row ``c`` of copy ``c``'s head outputs (``hook_z``), so all copies continue with the same residual stream.
A change of copy ``c``'s key input at ``p`` thus reaches the metric only through what query ``c`` reads, and
its gradient there is the edge's gradient. With ``positional=False`` there is one copy (position-free
gradients, summed over query positions).

Each receiver input becomes ``clean input + sum over senders s of r_s * (counter_s - out_s)`` where
``out_s`` is sender ``s``'s output in this pass and ``counter_s`` its counterfactual output: ``r = 0`` is the
model itself, ``r = 1`` on an edge is that edge patched. ``removal`` gives ``r``: a number (every edge of
the graph alike) or one tensor per receiver group (:mod:`circuits.edges.graph` shapes). ``leaves=True``
adds a zero tensor to every receiver input and returns the gradient of the summed metric there. A model without
MLPs (attention-only) keeps its MLP nodes in the graph with zero output and zero gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int

from circuits.edges.graph import Layout, Scores, Slot
from circuits.faithfulness import last_token_metrics
from interventions import parts
from interventions.adapter import ModelAdapter
from interventions.hooks import HookFn, HookPointLike
from interventions.readout import answer_positions

Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``metric(answer_logits, answers) -> [batch]``: per prompt, from the logits that predict the answer."""


def logit_diff(logits: Float[torch.Tensor, "batch *k d_vocab"], answers: Int[torch.Tensor, " batch *k"]
               ) -> Float[torch.Tensor, " batch"]:
    """The answer's logit minus the best other token's (the smallest margin over a teacher-forced answer of
    several tokens), as :func:`circuits.faithfulness.last_token_metrics`. Units: logits."""
    return last_token_metrics(logits, answers)[2]


@dataclass
class PassResult:
    """What one pass gives: the metric per prompt, every sender's output ``[batch, n_senders, n_pos,
    d_model]`` (detached) and, with leaves, the gradient of the summed metric at every receiver input."""

    metric: Float[torch.Tensor, " batch"]
    outputs: Float[torch.Tensor, "batch n_senders pos d_model"]
    grads: dict[Slot, torch.Tensor] = field(default_factory=dict)


def _patch(layout: Layout, slot: Slot, delta: torch.Tensor, removal: float | Scores | None) -> torch.Tensor | None:
    """``sum_s r_s delta_s`` for receiver group ``slot`` (shapes: ``q`` ``[b, pos, heads, d]``, ``k``/``v``
    ``[b, copies, pos, kv, d]``, else ``[b, pos, d]``); ``None`` when nothing is removed."""
    if removal is None:
        return None
    kind, _ = slot
    b, _, t, d = delta.shape
    if isinstance(removal, (int, float)):
        if removal == 0:
            return None
        summed = delta.sum(1) * float(removal)
        if kind == "q":
            return summed[:, :, None].expand(b, t, layout.n_heads, d)
        if kind in ("k", "v"):
            return summed[:, None, :, None].expand(b, layout.span, t, layout.n_kv_heads, d)
        return summed
    r = removal[slot].to(delta.device, delta.dtype)
    if not layout.positional:  # one weight per edge, for every position
        r = r.expand(*r.shape[:1], t, *r.shape[2:]) if kind in ("q", "mlp", "logits") else r.expand(
            r.shape[0], t, r.shape[2], 1)
    if kind == "q":
        return torch.einsum("bntd,nth->bthd", delta, r)
    if kind in ("k", "v"):
        return torch.einsum("bnpd,npkc->bcpkd", delta, r)
    return torch.einsum("bntd,nt->btd", delta, r)


def edge_pass(
    adapter: ModelAdapter,
    layout: Layout,
    tokens: Int[torch.Tensor, "batch pos"],
    answers: Int[torch.Tensor, " batch *k"],
    *,
    counter: Float[torch.Tensor, "batch n_senders pos d_model"] | None = None,
    removal: float | Scores | None = None,
    embed: Float[torch.Tensor, "batch pos d_model"] | None = None,
    leaves: bool = False,
    metric: Metric = logit_diff,
) -> PassResult:
    """One pass of the module docstring over ``tokens`` (one layout, on the model's device). ``counter``: the
    senders' counterfactual outputs (needed with ``removal``); ``embed``: the embedding's output to use
    instead of the model's (EAP-IG's interpolated inputs); ``leaves``: return receiver gradients (the pass
    then runs with gradients; the model's parameters should be frozen by the caller)."""
    model = adapter.model
    b, t = tokens.shape
    copies = t if layout.positional else 1
    big = tokens.repeat_interleave(copies, dim=0)
    w_o = parts.head_out_weights(adapter)
    outs: list[torch.Tensor] = []
    grads: dict[Slot, torch.Tensor] = {}
    leaf: dict[Slot, torch.Tensor] = {}
    diag = torch.arange(t)
    has_mlp = not bool(getattr(model.cfg, "attn_only", False))

    def spread(x: torch.Tensor) -> torch.Tensor:  # [b, ...] -> every copy
        return x[:, None].expand(b, copies, *x.shape[1:]).reshape(b * copies, *x.shape[1:])

    def first(x: torch.Tensor) -> torch.Tensor:  # copy 0 of [b * copies, ...]
        return x.reshape(b, copies, *x.shape[1:])[:, 0]

    def extra(slot: Slot, like: torch.Tensor) -> torch.Tensor | None:
        n = layout.n_up(*slot)
        add = None
        if removal is not None and counter is not None:
            run = torch.cat(outs, dim=1)[:, :n]
            add = _patch(layout, slot, counter[:, :n].to(run.dtype) - run, removal)
        if leaves:
            z = torch.zeros_like(like if add is None else add, requires_grad=True)
            leaf[slot] = z
            add = z if add is None else add + z
        return add

    def receiver(slot: Slot) -> Callable[[torch.Tensor, HookPointLike | None], torch.Tensor]:
        kind, _ = slot

        def fn(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            shape = (b, copies, *act.shape[1:]) if kind in ("k", "v") else (b, *act.shape[1:])
            like = act.new_zeros(shape)
            add = extra(slot, like)
            if add is None:
                return act
            if kind in ("k", "v"):
                return act + add.reshape(act.shape)
            return act + spread(add)

        return fn

    def on_embed(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
        if embed is not None:
            act = spread(embed.to(act.dtype))
        outs.append(first(act)[:, None])
        return act

    def on_z(layer: int) -> Callable[[torch.Tensor, HookPointLike | None], torch.Tensor]:
        def fn(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            if layout.positional:
                z = act.reshape(b, copies, *act.shape[1:])[:, diag, diag]  # row c of copy c: [b, pos, heads, d_head]
                act = spread(z)
            else:
                z = act
            outs.append(torch.einsum("bthe,hed->bhtd", z, w_o[layer].to(z.dtype)))
            if not has_mlp:  # an attention-only model: its MLP nodes output nothing
                outs.append(torch.zeros_like(outs[-1][:, :1]))
            return act

        return fn

    def on_mlp_out(act: torch.Tensor, hook: HookPointLike | None = None) -> None:
        outs.append(first(act)[:, None])

    hooks: list[tuple[str, HookFn]] = [(parts.embed_out(), on_embed)]
    for layer in range(layout.n_layers):
        kinds = ("q", "k", "v", "mlp") if has_mlp else ("q", "k", "v")
        hooks += [(parts.input_hook(k, layer), receiver((k, layer))) for k in kinds]
        hooks += [(parts.z(layer), on_z(layer))] + ([(parts.mlp_out(layer), on_mlp_out)] if has_mlp else [])
    hooks.append((parts.final_in(layout.n_layers), receiver(("logits", layout.n_layers))))
    with parts.split_inputs(adapter), adapter.hooks(hooks), torch.set_grad_enabled(leaves):
        logits = first(model(big.to(adapter.device())))
    values = metric(answer_positions(logits, answers.to(logits.device)), answers.to(logits.device))
    if leaves:
        slots = list(leaf)
        got = torch.autograd.grad(values.sum(), [leaf[s] for s in slots], allow_unused=True)
        grads = {s: (g if g is not None else torch.zeros_like(leaf[s])).detach() for s, g in zip(slots, got)}
        for layer in range(layout.n_layers if not has_mlp else 0):
            grads[("mlp", layer)] = torch.zeros(b, t, layout.d_model, dtype=values.dtype, device=values.device)
    return PassResult(metric=values.detach(), outputs=torch.cat(outs, dim=1).detach(), grads=grads)
