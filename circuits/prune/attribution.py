"""Attribution patching of attention heads: a first-order estimate of what removing a head does.

For a head ``(l, h)`` whose output ``z = blocks.{l}.attn.hook_z[:, :, h]`` (``[batch, pos, d_head]``,
before ``W_O``) would be replaced by an ablation value ``z_abl`` (zeros, or the cache's per-position
mean), the change of a metric ``M`` is estimated by one backward pass:

    delta_M(l, h) ~= sum_{batch, pos} grad_z M . (z_abl - z)

The metric is the *sum over prompts* of the logit difference at the last position (the answer token's
logit minus the best other token's logit of the whole vocabulary, as in
:func:`circuits.faithfulness.last_token_metrics`). The gradient is the total derivative: it includes
the paths through every later block, because ``z`` is made differentiable by adding a zero leaf tensor
at each hooked block (the model's parameters are frozen for the pass and restored afterwards).

The estimate is exact when the logits are linear in ``z`` (attention-only model without normalisation,
head in the last block) and the best other token does not change; otherwise it is first order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import torch
from jaxtyping import Float, Int

import interventions as iv
from circuits.faithfulness import last_token_metrics
from circuits.validation import check_choice
from circuits.vocab import HEAD_METHODS
from interventions import adapter as hooks
from interventions.hooks import HookPointLike
from interventions.readout import answer_positions
from interventions.registry import adapt
from interventions.types import Head, InterventionError, Model, Tokens
from interventions.validation import check_answers


@contextmanager
def frozen_parameters(model: Model) -> Iterator[None]:
    """Set ``requires_grad=False`` on every parameter of ``model`` for the ``with`` block, then restore."""
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def head_attribution_per_prompt(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    heads: Sequence[Head],
    interventions: Sequence[iv.Intervention] = (),
    *,
    method: str = "zero",
    cache: iv.MeanCache | None = None,
    batch_size: int = 128,
) -> Float[torch.Tensor, "batch n_heads_given"]:
    """Per prompt and head (in the order of ``heads``): estimated change of the logit difference when
    that head alone is ablated (``method`` ``"zero"`` or ``"mean"``) on top of ``interventions``.

    One forward and one backward pass over ``tokens`` (in batches of ``batch_size``). Positive = the
    removal is predicted to *raise* the answer's margin. Units: logits.
    """
    check_choice("attribution method", method, HEAD_METHODS)
    if method == "mean" and not isinstance(cache, iv.MeanCache):
        raise InterventionError("method='mean' needs cache=MeanCache.fit(model, tokens)")
    heads = [cast(Head, tuple(h)) for h in heads]
    if not heads:
        raise InterventionError("heads is empty: give at least one (layer, head) pair")
    ad = adapt(model)
    for layer, head in heads:
        ad.info.check_head(layer, head)
    answers = check_answers(answers, int(tokens.shape[0]))
    layers = sorted({layer for layer, _ in heads})
    device = ad.device()
    out = []
    with frozen_parameters(model), torch.enable_grad():
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start : start + batch_size].to(device)
            ans = answers[start : start + batch_size].to(device)
            z_seen: dict[int, torch.Tensor] = {}
            leaves: dict[int, torch.Tensor] = {}

            def make(layer: int, leaves: dict[int, torch.Tensor], z_seen: dict[int, torch.Tensor]):
                def fn(z: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
                    # z after every earlier hook of this point (e.g. a HeadAblation of removed heads).
                    leaf = torch.zeros_like(z, requires_grad=True)
                    leaves[layer] = leaf
                    z_seen[layer] = z.detach()
                    return z + leaf

                return fn

            # The leaf hooks go in after the interventions' hooks, so they see the intervened z.
            leaf_hooks = [(hooks.z(layer), make(layer, leaves, z_seen)) for layer in layers]
            with iv.apply(model, list(interventions)), ad.hooks(leaf_hooks):
                logits = model(batch)
            _, _, diff = last_token_metrics(answer_positions(logits, ans), ans)
            grads = torch.autograd.grad(diff.sum(), [leaves[layer] for layer in layers])
            grad = dict(zip(layers, grads))
            cols = []
            for layer, head in heads:
                z_head = z_seen[layer][:, :, head].float()
                if method == "zero":
                    target = torch.zeros_like(z_head)
                else:
                    assert cache is not None
                    target = cache.on("z_mean", z_head.device, z_head.dtype)[layer][:, head].expand_as(z_head)
                cols.append((grad[layer][:, :, head].float() * (target - z_head)).sum(dim=(1, 2)))
            out.append(torch.stack(cols, dim=1).detach().cpu())
    return torch.cat(out)


def head_attribution(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    heads: Sequence[Head],
    interventions: Sequence[iv.Intervention] = (),
    *,
    method: str = "zero",
    cache: iv.MeanCache | None = None,
    batch_size: int = 128,
) -> dict[Head, float]:
    """``{(layer, head): estimated change of the summed logit difference}`` when that head alone is
    ablated on top of ``interventions`` (see the module docstring); one forward + backward pass."""
    per_prompt = head_attribution_per_prompt(
        model, tokens, answers, heads, interventions, method=method, cache=cache, batch_size=batch_size
    )
    sums = per_prompt.sum(0).tolist()
    return {cast(Head, tuple(h)): float(v) for h, v in zip(heads, sums)}
