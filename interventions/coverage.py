"""What a :class:`~interventions.MeanCache` covers: which prompts it was fitted on, and how many fit prompts
stand behind each mean that scored prompts would read.

* :func:`row_digests`: one 64-bit digest per prompt (its token ids), so that a cache can tell whether a
  prompt was part of its fit set without keeping the fit tokens.
* :class:`Coverage`: per ``(position, token)`` entry that a set of scored prompts needs (positions ``>= 1``;
  BOS is never replaced), the number of fit prompts holding that token there; its minimum, median, the
  entries under a minimum count and those missing altogether, with the token as text where a tokenizer is
  given.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Int

from .types import JsonDict, Tokenizer

__all__ = ["Coverage", "EntryCount", "entry_counts", "row_digests", "token_text"]


def row_digests(tokens: Int[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, " batch"]:
    """One signed 64-bit BLAKE2b digest of each row's token ids (and its length): equal rows give equal
    digests; two different rows collide with probability about 2**-64."""
    rows = tokens.detach().cpu().long().contiguous().numpy()
    out = np.empty(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i] = np.frombuffer(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), dtype=np.int64)[0]
    return torch.from_numpy(out)


def entry_counts(fit_tokens: Int[torch.Tensor, "n_fit pos"], tokens: Int[torch.Tensor, "batch pos"]
                 ) -> Int[torch.Tensor, "batch pos"]:
    """``counts[b, t]``: how many rows of ``fit_tokens`` hold ``tokens[b, t]`` at position ``t`` (both one
    layout; position 0, BOS, counts every fit row)."""
    fit, toks = fit_tokens.detach().cpu().long(), tokens.detach().cpu().long()
    n_pos = int(toks.shape[1])
    width = int(max(int(toks.max()), int(fit.max()) if fit.numel() else 0)) + 1
    table = torch.zeros(n_pos, width, dtype=torch.long)
    if fit.numel():
        pos = torch.arange(n_pos).expand_as(fit)
        table.index_put_((pos.reshape(-1), fit.reshape(-1)), torch.ones(fit.numel(), dtype=torch.long),
                         accumulate=True)
    return table[torch.arange(n_pos).expand_as(toks), toks]


def token_text(tokenizer: Tokenizer | None, token: int) -> str:
    """``"'7' (id 10)"``: a token id with its text, for messages (the id alone without a tokenizer)."""
    if tokenizer is None:
        return f"token id {int(token)}"
    try:
        text = tokenizer.decode([int(token)])
    except Exception:  # noqa: BLE001 - any tokenizer's own failure on this id (HF, GGUF, the zoo's): say the id
        return f"token id {int(token)}"
    return f"{text!r} (id {int(token)})"


@dataclass(frozen=True)
class EntryCount:
    """One ``(position, token)`` entry (0-indexed position) and how many fit prompts hold it."""

    position: int
    token: int
    count: int

    def describe(self, tokenizer: Tokenizer | None = None) -> str:
        return f"{token_text(tokenizer, self.token)} at position {self.position}: {self.count}"


@dataclass(frozen=True)
class Coverage:
    """Fit counts of the entries some scored prompts need (see the module docstring).

    ``entries``: every needed entry with its count (sorted by count, then position and token);
    ``n_fit``: prompts in the fit set; ``min_count``: the minimum each entry must reach.
    """

    entries: tuple[EntryCount, ...]
    n_fit: int
    min_count: int
    under: tuple[EntryCount, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "under", tuple(e for e in self.entries if e.count < self.min_count))

    @classmethod
    def of(cls, counts: Int[torch.Tensor, "batch pos"], tokens: Int[torch.Tensor, "batch pos"], n_fit: int,
           min_count: int) -> Coverage:
        """From per-prompt counts (``counts[b, t]``: fit prompts holding ``tokens[b, t]`` at ``t``)."""
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        flat = [x[:, 1:].reshape(-1).tolist() for x in (positions, tokens.cpu(), counts.cpu())]
        seen = {(p, t): c for p, t, c in zip(*flat)}
        entries = sorted((EntryCount(p, t, c) for (p, t), c in seen.items()),
                         key=lambda e: (e.count, e.position, e.token))
        return cls(tuple(entries), int(n_fit), int(min_count))

    @property
    def missing(self) -> tuple[EntryCount, ...]:
        """The needed entries no fit prompt holds (count 0): CAMA on these prompts raises for them, until
        the cache is extended with fit prompts that hold them (``MeanCache.extend``)."""
        return tuple(e for e in self.entries if e.count == 0)

    def rows(self, tokenizer: Tokenizer | None = None) -> list[JsonDict]:
        """One dict per needed entry (``position``, ``token``, ``text`` (with ``tokenizer``, else ``None``),
        ``count``), fewest fit prompts first: ``pandas.DataFrame(coverage.rows(model.tokenizer))``."""
        return [{"position": e.position, "token": e.token, "count": e.count,
                 "text": tokenizer.decode([e.token]) if tokenizer is not None else None} for e in self.entries]

    @property
    def minimum(self) -> int:
        return min((e.count for e in self.entries), default=self.n_fit)

    @property
    def median(self) -> float:
        return float(np.median([e.count for e in self.entries])) if self.entries else float(self.n_fit)

    def summary(self, tokenizer: Tokenizer | None = None, limit: int = 20) -> JsonDict:
        """JSON-ready counts: ``n_entries``, ``min``, ``median``, ``min_count``, ``n_under`` and up to
        ``limit`` entries under the minimum (``under``: ``{"position", "token", "text", "count"}``)."""
        return {
            "n_fit": self.n_fit, "n_entries": len(self.entries), "min": self.minimum, "median": self.median,
            "min_count": self.min_count, "n_under": len(self.under),
            "under": [{"position": e.position, "token": e.token, "count": e.count,
                       "text": tokenizer.decode([e.token]) if tokenizer is not None else None}
                      for e in self.under[:limit]],
        }

    def line(self) -> str:
        """``"212 entries, 98-117 fit prompts each (median 100)"``."""
        top = max((e.count for e in self.entries), default=self.n_fit)
        return (f"{len(self.entries)} entries, {self.minimum}-{top} fit prompts each (median {self.median:g}), "
                f"minimum {self.min_count}")
