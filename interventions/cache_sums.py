"""The sums behind a :class:`~interventions.MeanCache`: fitting accumulates them over batches of prompts, and
extending a cache adds the sums of new fit prompts to those of the old ones (recovered as mean times count in
float64), so that ``fit(A).extend(B)`` holds the means of ``fit(A + B)`` (to float32 rounding).

Entries are the distinct ``(position, token)`` pairs of the fit prompts, sorted by position, then token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from . import adapter as hooks
from .adapter import ModelAdapter

__all__ = ["Sums", "accumulate", "merge"]


@dataclass
class Sums:
    """Float64 sums over ``n`` fit prompts of one layout: per entry (``entry_pos``, ``entry_tok``, its prompt
    count ``entry_count``) the residual after every block (``cond``), and per position the residual (``pos``)
    and every query head's ``hook_z`` (``z``)."""

    entry_pos: Int[torch.Tensor, " n_entries"]
    entry_tok: Int[torch.Tensor, " n_entries"]
    entry_count: Int[torch.Tensor, " n_entries"]
    cond: Float[torch.Tensor, "n_layers n_entries d_model"]
    pos: Float[torch.Tensor, "n_layers n_pos d_model"]
    z: Float[torch.Tensor, "n_layers n_pos n_heads d_head"]
    n: int

    def means(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(cond_mean, pos_mean, z_mean)`` in float32 on the CPU."""
        counts = self.entry_count.to(device=self.cond.device, dtype=torch.float64)
        return ((self.cond / counts[None, :, None]).float().cpu(), (self.pos / self.n).float().cpu(),
                (self.z / self.n).float().cpu())


def accumulate(ad: ModelAdapter, tokens: Int[torch.Tensor, "batch pos"], *, batch_size: int, progress: bool,
               d_vocab: int) -> Sums:
    """The sums of ``tokens`` (checked: one layout, BOS at 0) on the model of ``ad``, streamed over batches of
    ``batch_size`` prompts: per batch the backend returns the activations (every block's residual, and its
    ``hook_z`` already summed over the batch; on a remote backend they are downloaded) and the sums are
    accumulated here, so the residuals of one batch are held at once."""
    info = ad.info
    n, n_pos = tokens.shape
    key = torch.arange(n_pos).unsqueeze(0) * d_vocab + tokens.cpu()
    uniq, inverse = torch.unique(key, return_inverse=True)
    device = ad.device()
    f64 = torch.float64
    cond = torch.zeros(info.n_layers, len(uniq), info.d_model, dtype=f64, device=device)
    pos = torch.zeros(info.n_layers, n_pos, info.d_model, dtype=f64, device=device)
    z = torch.zeros(info.n_layers, n_pos, info.n_heads, info.d_head, dtype=f64, device=device)
    entry_count = torch.bincount(inverse.flatten(), minlength=len(uniq))
    inverse = inverse.to(device)
    names = [hooks.resid_post(layer) for layer in range(info.n_layers)]
    summed = [hooks.z(layer) for layer in range(info.n_layers)]
    with torch.inference_mode():
        for start in tqdm(range(0, n, batch_size), desc="MeanCache.fit", unit="batch", disable=not progress):
            acts = ad.activations(tokens[start : start + batch_size].to(device), names, summed=summed)
            idx = inverse[start : start + batch_size].reshape(-1)
            for layer in range(info.n_layers):
                a = acts[hooks.resid_post(layer)].to(device=device, dtype=f64)
                cond[layer].index_add_(0, idx, a.reshape(-1, info.d_model))
                pos[layer] += a.sum(0)
                z[layer] += acts[hooks.z(layer)].to(device=device, dtype=f64)
    return Sums(uniq // d_vocab, uniq % d_vocab, entry_count, cond, pos, z, int(n))


def merge(a: Sums, b: Sums) -> Sums:
    """The sums of the fit prompts of ``a`` and ``b`` together (one layout and model; entries sorted as
    :func:`accumulate` sorts them)."""
    device = a.cond.device
    width = int(max(int(a.entry_tok.max()), int(b.entry_tok.max()))) + 1
    keys = [s.entry_pos.cpu() * width + s.entry_tok.cpu() for s in (a, b)]
    uniq = torch.unique(torch.cat(keys))
    count = torch.zeros(len(uniq), dtype=torch.long)
    cond = torch.zeros(a.cond.shape[0], len(uniq), a.cond.shape[2], dtype=torch.float64, device=device)
    for s, k in zip((a, b), keys):
        slot = torch.searchsorted(uniq, k)
        count.index_add_(0, slot, s.entry_count.cpu())
        cond.index_add_(1, slot.to(device), s.cond.to(device))
    return Sums(uniq // width, uniq % width, count, cond, a.pos + b.pos.to(device), a.z + b.z.to(device), a.n + b.n)
