"""``(position, token) -> entry`` lookup of a :class:`~interventions.MeanCache`, and the error it raises for
pairs the fit prompts never held.

:class:`UncoveredEntryError` keeps the uncovered pairs as numbers, so that :func:`interventions.apply` (which
knows the model, hence its tokenizer) re-raises it naming each token as text: ``'7' (id 10) at position 1``.
A hook never holds a tokenizer (a remote request ships what its hooks hold).
"""

from __future__ import annotations

import torch
from jaxtyping import Int

from .coverage import token_text
from .types import CacheMismatchError, Tokenizer, Tokens

__all__ = ["EntryIndexer", "UncoveredEntryError"]

LISTED = 5
"""How many uncovered pairs a message names."""


class UncoveredEntryError(CacheMismatchError):
    """Prompts hold ``(position, token)`` pairs the cache's fit prompts never held at that position.

    ``pairs``: the distinct uncovered ``(position, token)`` pairs, in order of first occurrence; ``first``:
    ``(prompt, position)`` of the first uncovered slot in the batch (``None`` for a single lookup);
    ``n_slots``: uncovered (prompt,
    position) slots in all; ``n_fit``: the cache's fit prompts. :meth:`with_tokenizer` gives the same error
    naming the tokens as text."""

    def __init__(self, pairs: list[tuple[int, int]], first: tuple[int, int] | None, n_slots: int, n_fit: int,
                 tokenizer: Tokenizer | None = None):
        self.pairs, self.first, self.n_slots, self.n_fit = list(pairs), first, int(n_slots), int(n_fit)
        self.tokenizer = tokenizer
        super().__init__(self.message())

    def describe(self, position: int, token: int) -> str:
        """``"'7' (id 10) at position 1"`` (``"token id 10 at position 1"`` without a tokenizer)."""
        return f"{token_text(self.tokenizer, token)} at position {position}"

    def message(self) -> str:
        position, token = self.pairs[0]
        where = "" if self.first is None else f" (prompt {self.first[0]} of the batch)"
        head = (f"the MeanCache has no mean for {self.describe(position, token)}{where}: none of its {self.n_fit} "
                f"fit prompts holds that token there")
        if self.first is not None:
            listed = ", ".join(self.describe(p, t) for p, t in self.pairs[:LISTED])
            more = f", and {len(self.pairs) - LISTED} more" if len(self.pairs) > LISTED else ""
            head += (f"; {len(self.pairs)} (position, token) pair(s) of these prompts are uncovered ({listed}{more}; "
                     f"{self.n_slots} (prompt, position) slots)")
        return (f"{head}. Fit a cache on prompts that cover them (MeanCache.fit), or add such fit prompts with "
                f"cache = cache.extend(model, more_fit_tokens); cache.coverage(tokens).missing lists them")

    def with_tokenizer(self, tokenizer: Tokenizer | None) -> UncoveredEntryError:
        """This error naming the tokens as text with ``tokenizer`` (itself when ``tokenizer`` is ``None``)."""
        if tokenizer is None or self.tokenizer is not None:
            return self
        return UncoveredEntryError(self.pairs, self.first, self.n_slots, self.n_fit, tokenizer)


class EntryIndexer:
    """``(position, token) -> entry`` of a :class:`~interventions.MeanCache` (``MeanCache.indexer``): ``table``
    is ``[n_pos, width]`` long, ``-1`` for pairs the ``n_prompts`` fit prompts never held."""

    def __init__(self, table: Int[torch.Tensor, "n_pos width"], n_prompts: int):
        self.table = table
        self.n_pos = int(table.shape[0])
        self.n_prompts = int(n_prompts)

    def __call__(self, tokens: Tokens, *, positions_from: int = 1, tokenizer: Tokenizer | None = None
                 ) -> Int[torch.Tensor, "batch pos"]:
        """Entry index of every ``(position, token)`` of ``tokens`` (``-1`` before ``positions_from``); raises
        :class:`CacheMismatchError` for another prompt length and :class:`UncoveredEntryError` for pairs never
        seen (tokens named as text with ``tokenizer``)."""
        if tokens.ndim != 2 or tokens.shape[1] != self.n_pos:
            raise CacheMismatchError(
                f"prompt length {tokens.shape[-1]} differs from the cache's fit layout of "
                f"{self.n_pos} tokens: fit one MeanCache per layout (prompt token length)"
            )
        toks = tokens.cpu()
        in_vocab = toks < self.table.shape[1]
        idx = torch.full_like(toks, -1)
        pos_grid = torch.arange(self.n_pos).expand_as(toks)
        idx[in_vocab] = self.table[pos_grid[in_vocab], toks[in_vocab]]
        idx[:, :positions_from] = 0
        missing = torch.nonzero(idx < 0)
        if len(missing):
            pairs = list(dict.fromkeys((int(p), int(toks[b, p])) for b, p in missing.tolist()))
            b, p = (int(v) for v in missing[0])
            raise UncoveredEntryError(pairs, (b, p), len(missing), self.n_prompts, tokenizer)
        idx[:, :positions_from] = -1
        return idx.to(tokens.device)
