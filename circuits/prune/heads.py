"""The heads of a pruning run: the transfer heads, the pruned subgraph and what heads attend to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from jaxtyping import Float

import interventions as iv
from interventions import adapter as hooks
from interventions.hooks import HookPointLike
from interventions.registry import adapt
from interventions.types import Head, Model, Tokens
from interventions.validation import check_tokens


def transfer_heads(n_layers: int, n_heads: int, wait: int, transfer: int) -> list[Head]:
    """Every query head of the transfer blocks ``wait+1 .. wait+transfer``, sorted by (layer, head)."""
    return [(layer, head) for layer in range(wait + 1, wait + 1 + transfer) for head in range(n_heads)]


def pruned_subgraph(
    base: Sequence[iv.Intervention], removed: Sequence[Head], method: str, cache: iv.MeanCache | None
) -> list[iv.Intervention]:
    """``base`` plus a :class:`HeadAblation` of ``removed`` (nothing added when ``removed`` is empty)."""
    items = list(base)
    if removed:
        items.append(iv.HeadAblation(heads=tuple(sorted(removed)), method=method, cache=cache))
    return items


@torch.inference_mode()
def head_attention(
    model: Model,
    tokens: Tokens,
    heads: Sequence[Head],
    interventions: Sequence[iv.Intervention] = (),
    *,
    batch_size: int = 128,
) -> dict[Head, Float[torch.Tensor, " pos"]]:
    """What ``heads`` attend to: the last position's attention pattern (post-softmax, after the
    interventions' masks), averaged over prompts, per key position ``0 .. pos-1`` (BOS at 0)."""
    tokens = check_tokens(tokens)
    ad = adapt(model)
    heads = sorted({cast(Head, tuple(h)) for h in heads})
    for layer, head in heads:
        ad.info.check_head(layer, head)
    layers = sorted({layer for layer, _ in heads})
    sums = {layer: torch.zeros(ad.info.n_heads, tokens.shape[1], dtype=torch.float64) for layer in layers}

    def make(layer: int):
        def fn(pattern: torch.Tensor, hook: HookPointLike | None = None) -> None:
            sums[layer] += pattern[:, :, -1].detach().double().sum(0).cpu()

        return fn

    names = [hooks.pattern(layer) for layer in layers]
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size].to(ad.device())
        with iv.apply(model, list(interventions)), ad.hooks([(n, make(layer)) for layer, n in zip(layers, names)]):
            model(batch)
    n = tokens.shape[0]
    return {(layer, head): (sums[layer][head] / n).float() for layer, head in heads}


def key_labels(model: Model, tokens: Tokens) -> list[str]:
    """A label per key position: the token's text where every prompt holds the same token there
    (``#id`` without a tokenizer), else ``pos {i}`` (a varying position such as an operand)."""
    labels = []
    for pos in range(tokens.shape[1]):
        col = tokens[:, pos]
        if bool((col == col[0]).all()):
            tok = int(col[0])
            text = None
            if getattr(model, "tokenizer", None) is not None:
                try:
                    text = model.tokenizer.decode([tok])
                except Exception:  # noqa: BLE001 - any tokenizer's own failure (HF, GGUF, the zoo's): a label only
                    text = None
            labels.append(repr(text) if text is not None else f"#{tok}")
        else:
            labels.append(f"pos {pos}")
    return labels


@torch.inference_mode()
def candidate_logits(
    model: Model, tokens: Tokens, n_answer: int, base: Sequence[iv.Intervention], removed: Sequence[Head],
    candidates: Sequence[Head], method: str, cache: iv.MeanCache | None, *, batch_size: int = 128,
) -> dict[Head, Float[torch.Tensor, "batch *k d_vocab"]]:
    """Answer logits of every prompt with ``removed`` plus one candidate head removed, for each of ``candidates``
    (what :func:`pruned_subgraph` of ``removed + [candidate]`` gives, pass by pass), several candidates per
    forward pass: the prompts repeated once per candidate, each block of rows with its own heads removed
    (:class:`interventions.HeadAblationGroups`), about ``batch_size`` rows per pass (one candidate per pass
    when the prompts fill a batch). ``[batch, d_vocab]``, or ``[batch, k, d_vocab]`` for ``n_answer = k > 1``."""
    n = int(tokens.shape[0])
    chunk = min(n, batch_size)
    per_pass = max(1, batch_size // chunk)
    out: dict[Head, list[torch.Tensor]] = {h: [] for h in candidates}
    for c in range(0, len(candidates), per_pass):
        group = list(candidates[c : c + per_pass])
        ablation = iv.HeadAblationGroups(groups=tuple(tuple(sorted([*removed, h])) for h in group), method=method,
                                         cache=cache)
        for start in range(0, n, chunk):
            batch = tokens[start : start + chunk]
            rows = [(batch.repeat(len(group), 1), [*base, ablation])]
            # the last position only where one answer token is read (as circuits.faithfulness.last_logits)
            logits = iv.run_many(model, rows)[0] if n_answer == 1 else iv.run_many(model, rows, logits="all")[0]
            last = logits[:, -1] if n_answer == 1 else logits[:, -n_answer:]
            for i, h in enumerate(group):
                out[h].append(last[i * len(batch) : (i + 1) * len(batch)].float())
    return {h: torch.cat(parts) for h, parts in out.items()}
