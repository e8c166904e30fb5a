"""Independent reference implementations the interventions are checked against.

Written without the package's code paths: plain hooks with ``-inf`` score masks, conditional means
computed with Python dictionaries from ``run_with_cache``, head removal by editing the output weights.
They work on both backends: on the bridges of the test suite (Hugging Face GPT-2 / NeoX / Llama
attention) ``hook_attn_scores`` is pre-softmax and editable, as on ``HookedTransformer``.
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch


def score_mask_hook(allowed: torch.Tensor):
    """Hook for ``attn.hook_attn_scores`` (pre-softmax on TransformerLens 3.9): ``-inf`` where not allowed."""

    def hook(scores, hook=None):
        n = scores.shape[-1]
        return scores.masked_fill(~allowed[:n, :n].to(scores.device), float("-inf"))

    return hook


def peek_allowed(n_pos: int, mode: str, queries: str, keep_bos: bool = True) -> torch.Tensor:
    """Allowed (query, key) links written out element by element."""
    allowed = torch.zeros(n_pos, n_pos, dtype=torch.bool)
    last = n_pos - 1
    for q in range(n_pos):
        selected = (queries == "all") or (queries == "last" and q == last) or (queries == "others" and q != last)
        for k in range(q + 1):
            if mode == "full" or not selected:
                allowed[q, k] = True
            else:
                allowed[q, k] = (k == q) or (keep_bos and k == 0)
    return allowed


def conditional_means(model, tokens: torch.Tensor, layer: int) -> dict[tuple[int, int], torch.Tensor]:
    """{(position, token): mean resid_post of ``layer``} over the prompts of ``tokens``, by dictionary."""
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.hook_resid_post")
    resid = cache[f"blocks.{layer}.hook_resid_post"].double()
    sums: dict = defaultdict(lambda: 0)
    counts: dict = defaultdict(int)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            key = (t, int(tokens[b, t]))
            sums[key] = sums[key] + resid[b, t]
            counts[key] += 1
    return {k: (sums[k] / counts[k]).float() for k in sums}


def cama_hook(means: dict, tokens: torch.Tensor):
    def hook(resid, hook=None):
        out = resid.clone()
        for b in range(tokens.shape[0]):
            for t in range(1, tokens.shape[1]):
                out[b, t] = means[(t, int(tokens[b, t]))]
        return out

    return hook


def without_heads(model, heads):
    """A deep copy of ``model`` whose output weights of ``heads`` are zero (zero ablation by weights).

    ``HookedTransformer``: ``W_O[head]`` (``[n_heads, d_head, d_model]``). ``TransformerBridge``: its
    ``W_O`` is a computed view, so the wrapped Hugging Face output projection is edited instead: the
    ``d_head`` input features of the head (rows of a GPT-2 ``Conv1D`` ``[in, out]``, columns of an
    ``nn.Linear`` ``[out, in]``).
    """
    # A NeoX-class bridge keeps its last attention pattern (with its autograd graph) on the module,
    # which deepcopy refuses: such non-leaf tensors are left out of the copy.
    memo = {
        id(value): None
        for module in model.modules()
        for value in vars(module).values()
        if isinstance(value, torch.Tensor) and not value.is_leaf
    }
    clone = copy.deepcopy(model, memo)
    d_head = clone.cfg.d_head
    with torch.no_grad():
        for layer, head in heads:
            attn = clone.blocks[layer].attn
            proj = getattr(getattr(attn, "o", None), "original_component", None)
            if proj is None:
                attn.W_O[head] = 0.0
                continue
            cols = slice(head * d_head, (head + 1) * d_head)
            if type(proj).__name__ == "Conv1D":
                proj.weight[cols] = 0.0
            else:
                proj.weight[:, cols] = 0.0
    return clone


def z_means(model, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """Per-position mean of ``hook_z`` of ``layer``: ``[pos, n_heads, d_head]``."""
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_z")
    return cache[f"blocks.{layer}.attn.hook_z"].double().mean(0).float()


def head_score_mask_hook(allowed: torch.Tensor, heads, n_heads: int):
    """Hook for ``attn.hook_attn_scores`` (``[batch, head, query, key]``): ``-inf`` where ``allowed``
    (``[query, key]``) forbids, in the query heads ``heads`` only; every other head keeps its scores.
    The per-head mask is written out head by head."""
    n = allowed.shape[0]
    per_head = torch.ones(n_heads, n, n, dtype=torch.bool)
    for h in range(n_heads):
        if h in heads:
            per_head[h] = allowed

    def hook(scores, hook=None):
        k = scores.shape[-1]
        return scores.masked_fill(~per_head[:, :k, :k].to(scores.device), float("-inf"))

    return hook
