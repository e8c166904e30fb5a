"""Cached activation means for CAMA, plain mean ablation and mean head ablation.

A :class:`MeanCache` is fitted once on the prompts of one *layout* (every prompt has the same token
length ``n_pos``, BOS at position 0) and holds, for every block ``l`` (0-indexed):

* the residual stream after the block (``blocks.{l}.hook_resid_post``), averaged over fit prompts that
  hold the same token at the same position: one *entry* per seen ``(position, token)`` pair, with its
  prompt count (CAMA);
* the plain per-position mean of that residual (mean ablation);
* the per-position mean of every query head's output ``attn.hook_z`` (mean head ablation).

It also keeps one 64-bit digest per fit prompt (:func:`~interventions.coverage.row_digests`), so that
:meth:`MeanCache.contains` tells whether a prompt was in the fit set (a prompt must never be ablated with
a mean it contributes to: fit on a separate set, see ``circuits.prompts.fitset``). :meth:`MeanCache.coverage`
counts the fit prompts behind every mean a set of prompts would read (and lists the pairs never seen),
:meth:`MeanCache.covers` tells which prompts CAMA can ablate, and :meth:`MeanCache.extend` adds fit prompts
(the means become those of a fit on both sets: :mod:`interventions.cache_sums`).

All means are stored in float32 and accumulated in float64. Memory of the conditional means is
``n_layers * n_entries * d_model * 4`` bytes, where ``n_entries`` is the number of distinct
``(position, token)`` pairs in the fit set; e.g. Llama-3-8B (32 blocks, d_model 4096) on a two-operand
task with 1000 distinct operand values per position: ``32 * ~2003 * 4096 * 4 B = 1.05 GB``.

Files are safetensors with JSON metadata (never pickle; :mod:`interventions.cache_file`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int

from . import cache_file
from .adapter import ModelAdapter
from .cache_sums import Sums, accumulate, merge
from .coverage import Coverage, row_digests, token_text
from .entries import EntryIndexer, UncoveredEntryError
from .registry import adapt
from .types import CacheMismatchError, InterventionError, JsonDict, Model, Tokenizer, Tokens
from .validation import check_layout, check_positive, check_tokens, special_token_ids

FORMAT_VERSION = cache_file.FORMAT_VERSION
"""Version 2 adds ``fit_rows`` (digests of the fit prompts); version-1 files load with ``fit_rows=None``."""


class MeanCache:
    """Per-layer, per-position (and per-token) activation means of one prompt layout.

    Build with :meth:`fit` (grow with :meth:`extend`); read with :meth:`mean`; ask what it covers with
    :meth:`coverage` / :meth:`covers` / :meth:`tokens_at`; persist with :meth:`save` / :meth:`load`.
    """

    def __init__(
        self,
        *,
        entry_pos: Int[torch.Tensor, " n_entries"],
        entry_tok: Int[torch.Tensor, " n_entries"],
        entry_count: Int[torch.Tensor, " n_entries"],
        cond_mean: Float[torch.Tensor, "n_layers n_entries d_model"],
        pos_mean: Float[torch.Tensor, "n_layers n_pos d_model"],
        z_mean: Float[torch.Tensor, "n_layers n_pos n_heads d_head"],
        n_prompts: int,
        model_signature: JsonDict,
        source: str | None = None,
        fit_rows: Int[torch.Tensor, " n_prompts"] | None = None,
    ):
        self.entry_pos = entry_pos.long()
        self.entry_tok = entry_tok.long()
        self.entry_count = entry_count.long()
        self.cond_mean = cond_mean.float()
        self.pos_mean = pos_mean.float()
        self.z_mean = z_mean.float()
        self.n_prompts = int(n_prompts)
        self.model_signature = dict(model_signature)
        self.source = source
        self.fit_rows = None if fit_rows is None else torch.unique(fit_rows.long())
        self.n_layers, self.n_pos, self.d_model = (int(s) for s in pos_mean.shape)
        self._lookup: EntryIndexer | None = None
        self._device_copies: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}
        self._layer_copies: dict[tuple[str, int], torch.Tensor] = {}
        self._sha: str | None = None

    # --- fitting -----------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        model: Model,
        tokens: Tokens,
        *,
        batch_size: int = 64,
        progress: bool = True,
    ) -> MeanCache:
        """Fit the means on ``tokens`` (``[batch, pos]`` long, one layout, BOS at position 0).

        Streams over batches of ``batch_size`` prompts: per batch the backend returns the activations
        (``adapt(model).activations``: every block's residual, and its ``hook_z`` already summed over the
        batch; on a remote backend they are downloaded) and the sums are accumulated here, so the
        residuals of one batch are held at once.
        """
        ad = adapt(model)
        tokens = cls.checked_fit_tokens(ad, tokens, batch_size)
        sums = accumulate(ad, tokens, batch_size=batch_size, progress=progress, d_vocab=ad.info.d_vocab)
        return cls.from_sums(sums, {**ad.info.signature(), "fingerprint": ad.fingerprint()}, row_digests(tokens))

    @staticmethod
    def checked_fit_tokens(ad: ModelAdapter, tokens: Tokens, batch_size: int) -> Tokens:
        """``tokens`` checked as fit prompts of the model of ``ad``: long ids in its vocabulary, one layout,
        BOS at position 0, no padding (``batch_size`` must be positive)."""
        tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)
        check_positive("batch_size", batch_size)
        bos_id, pad_id = special_token_ids(ad.model)
        check_layout(tokens, bos_id=bos_id, pad_id=pad_id)
        return tokens

    @classmethod
    def from_sums(cls, sums: Sums, model_signature: JsonDict,
                  fit_rows: Int[torch.Tensor, " n_prompts"] | None) -> MeanCache:
        """The cache of the float64 sums of :mod:`interventions.cache_sums` (means rounded to float32)."""
        cond_mean, pos_mean, z_mean = sums.means()
        return cls(entry_pos=sums.entry_pos.cpu(), entry_tok=sums.entry_tok.cpu(), entry_count=sums.entry_count.cpu(),
                   cond_mean=cond_mean, pos_mean=pos_mean, z_mean=z_mean, n_prompts=sums.n,
                   model_signature=model_signature, fit_rows=fit_rows)

    def sums(self, device: torch.device | str | None = None) -> Sums:
        """The float64 sums behind the means (mean times count: exact up to the float32 rounding of the
        means), on ``device`` (default the CPU)."""
        f64 = torch.float64
        counts = self.entry_count.to(device, f64)
        return Sums(self.entry_pos, self.entry_tok, self.entry_count,
                    self.cond_mean.to(device, f64) * counts[None, :, None],
                    self.pos_mean.to(device, f64) * self.n_prompts, self.z_mean.to(device, f64) * self.n_prompts,
                    self.n_prompts)

    def extend(self, model: Model, tokens: Tokens, *, batch_size: int = 64, progress: bool = True) -> MeanCache:
        """A new cache fitted on this cache's fit prompts plus ``tokens`` (``[batch, pos]``, the same layout,
        BOS at 0), on the model this cache was fitted on; this cache is left unchanged.

        The means equal those of :meth:`fit` on both prompt sets together, to the float32 rounding of the
        stored means (their sums are recovered as mean times count in float64). ``(position, token)`` pairs
        that only ``tokens`` hold become new entries, so ``cache.extend(model, more)`` is how a cache comes
        to cover prompts it lacks (:meth:`coverage`, :meth:`covers`). Prompts already in the fit set are
        refused (they would count twice); pass ``tokens[~cache.contains(tokens)]``."""
        ad = adapt(model)
        self.check_model(ad)
        tokens = self.checked_fit_tokens(ad, tokens, batch_size)
        if tokens.shape[1] != self.n_pos:
            raise CacheMismatchError(
                f"prompt length {tokens.shape[1]} differs from the cache's fit layout of {self.n_pos} tokens: a "
                f"cache extends with prompts of its own layout (fit one MeanCache per layout)"
            )
        if self.fit_rows is not None:
            again = int(self.contains(tokens).sum())
            if again:
                raise CacheMismatchError(
                    f"{again} of these {len(tokens)} prompts are already in the cache's fit set and would count "
                    f"twice: extend with new prompts only (tokens[~cache.contains(tokens)])"
                )
        device = ad.device()
        new = accumulate(ad, tokens, batch_size=batch_size, progress=progress, d_vocab=ad.info.d_vocab)
        rows = None if self.fit_rows is None else torch.cat([self.fit_rows, row_digests(tokens)])
        return type(self).from_sums(merge(self.sums(device), new), self.model_signature, rows)

    # --- reading -----------------------------------------------------------------------------
    def check_layer(self, layer: int) -> None:
        """Raise :class:`InterventionError` unless ``layer`` is a block the cache holds (0-indexed)."""
        if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise InterventionError(
                f"layer={layer!r} is out of range: the cache holds blocks 0..{self.n_layers - 1}"
            )

    def _position(self, position: int) -> int:
        if not isinstance(position, int) or not -self.n_pos <= position < self.n_pos:
            raise InterventionError(
                f"position={position!r} is out of range: the cache was fitted on prompts of "
                f"{self.n_pos} tokens (positions 0..{self.n_pos - 1}, or negative from the end)"
            )
        return position % self.n_pos

    def mean(self, layer: int, position: int, token: int | None = None) -> Float[torch.Tensor, " d_model"]:
        """Mean of ``blocks.{layer}.hook_resid_post`` at ``position``.

        ``token=None``: the plain mean over all fit prompts. ``token=id``: the mean over fit prompts
        holding token ``id`` at ``position`` (what CAMA writes); raises if no fit prompt did.
        """
        self.check_layer(layer)
        pos = self._position(position)
        if token is None:
            return self.pos_mean[layer, pos]
        return self.cond_mean[layer, self._entry(pos, int(token))]

    def count(self, position: int, token: int) -> int:
        """How many fit prompts hold ``token`` at ``position`` (0 if none)."""
        pos = self._position(position)
        hit = (self.entry_pos == pos) & (self.entry_tok == int(token))
        return int(self.entry_count[hit].sum())

    def tokens_at(self, position: int) -> dict[int, int]:
        """``{token id: prompt count}`` of the fit set at ``position``."""
        pos = self._position(position)
        sel = self.entry_pos == pos
        return dict(zip(self.entry_tok[sel].tolist(), self.entry_count[sel].tolist()))

    def counts(self, tokens: Tokens) -> Int[torch.Tensor, "batch pos"]:
        """``counts[b, t]``: how many fit prompts hold ``tokens[b, t]`` at position ``t`` (0 where none
        did; position 0 and any position of another prompt length: 0). ``tokens``: ``[batch, pos]``."""
        toks = tokens.detach().cpu().long()
        out = torch.zeros_like(toks)
        if toks.ndim != 2 or toks.shape[1] != self.n_pos:
            return out
        table = torch.zeros(self.n_pos, int(max(int(self.entry_tok.max()), int(toks.max()))) + 1, dtype=torch.long)
        table[self.entry_pos, self.entry_tok] = self.entry_count
        out[:, 1:] = table[torch.arange(1, self.n_pos).expand(len(toks), -1), toks[:, 1:]]
        return out

    def coverage(self, tokens: Tokens, min_count: int = 1, *, conditional: bool = True) -> Coverage:
        """The fit counts behind every mean that ``tokens`` (``[batch, pos]``, the fit layout) read: per
        ``(position, token)`` entry at positions ``>= 1`` (``conditional``, CAMA), or the fit set's size at
        every position (``conditional=False``: plain means and head means average over all fit prompts)."""
        counts = self.counts(tokens) if conditional else torch.full_like(tokens.cpu().long(), self.n_prompts)
        return Coverage.of(counts, tokens.cpu().long(), self.n_prompts, min_count)

    def covers(self, tokens: Tokens) -> Bool[torch.Tensor, " batch"]:
        """``[batch]`` bool: which prompts of ``tokens`` CAMA can ablate with this cache (every ``(position,
        token)`` at positions ``>= 1`` held by at least one fit prompt; all False for another prompt length).
        :meth:`coverage` lists the pairs and their counts, ``coverage(tokens).missing`` those never seen."""
        toks = tokens.detach().cpu().long()
        if toks.ndim != 2 or toks.shape[1] != self.n_pos:
            return torch.zeros(len(toks), dtype=torch.bool)
        return (self.counts(toks)[:, 1:] > 0).all(dim=1)

    def contains(self, tokens: Tokens) -> Bool[torch.Tensor, " batch"]:
        """``[batch]`` bool: which prompts of ``tokens`` were in the fit set (by digest). Raises
        :class:`CacheMismatchError` for a cache saved before fit digests were kept (format version 1)."""
        if self.fit_rows is None:
            raise CacheMismatchError(
                "this MeanCache does not record which prompts it was fitted on (written by an earlier version): "
                "refit it with MeanCache.fit on a fit set that excludes the prompts you score"
            )
        return torch.isin(row_digests(tokens), self.fit_rows)

    def describe_entry(self, position: int, token: int, tokenizer: Tokenizer | None = None) -> str:
        """``"'7' (id 10) at position 1"`` (the id alone without a tokenizer)."""
        return f"{token_text(tokenizer, token)} at position {position}"

    def _entry(self, pos: int, token: int) -> int:
        hit = torch.nonzero((self.entry_pos == pos) & (self.entry_tok == token)).flatten()
        if len(hit) == 0:
            raise UncoveredEntryError([(pos, token)], None, 1, self.n_prompts)
        return int(hit[0])

    def entry_index(self, tokens: Tokens, *, positions_from: int = 1, tokenizer: Tokenizer | None = None
                    ) -> Int[torch.Tensor, "batch pos"]:
        """Entry index of every ``(position, token)`` of ``tokens`` (``-1`` before ``positions_from``).

        Raises :class:`CacheMismatchError` naming the lengths when the layout differs from the fit layout,
        and :class:`~interventions.entries.UncoveredEntryError` naming the uncovered ``(position, token)``
        pairs (as text with ``tokenizer``) when some were never seen.
        """
        return self.indexer()(tokens, positions_from=positions_from, tokenizer=tokenizer)

    def indexer(self) -> EntryIndexer:
        """The ``(position, token) -> entry`` lookup alone (small: ``n_pos x`` largest token id), for hooks that
        should not carry the whole cache (a remote request ships what its hooks hold)."""
        if self._lookup is None:
            width = int(self.entry_tok.max()) + 1 if len(self.entry_tok) else 1
            table = torch.full((self.n_pos, width), -1, dtype=torch.long)
            table[self.entry_pos, self.entry_tok] = torch.arange(len(self.entry_pos))
            self._lookup = EntryIndexer(table, self.n_prompts)
        return self._lookup

    def layer(self, name: str, layer: int) -> Float[torch.Tensor, "*shape"]:
        """A copy of ``cond_mean``, ``pos_mean`` or ``z_mean`` of block ``layer`` (0-indexed) that shares no
        storage with the cache (so a hook holding it carries one block's means, not every block's). One
        copy per block (memoised): the configurations of one wait in one request share it."""
        self.check_layer(layer)
        if (name, layer) not in self._layer_copies:
            self._layer_copies[name, layer] = getattr(self, name)[layer].clone()
        return self._layer_copies[name, layer]

    def on(self, name: str, device: torch.device, dtype: torch.dtype) -> Float[torch.Tensor, "*shape"]:
        """``cond_mean``, ``pos_mean`` or ``z_mean`` on ``device``/``dtype`` (memoised)."""
        key = (name, torch.device(device), dtype)
        if key not in self._device_copies:
            self._device_copies[key] = getattr(self, name).to(device=device, dtype=dtype)
        return self._device_copies[key]

    # --- identity ----------------------------------------------------------------------------
    def check_model(self, model: Model | ModelAdapter) -> None:
        """Raise :class:`CacheMismatchError` if this cache was fitted on a different model."""
        ad = model if isinstance(model, ModelAdapter) else adapt(model)
        theirs = {**ad.info.signature(), "fingerprint": ad.fingerprint()}
        diff = {k: (v, theirs.get(k)) for k, v in self.model_signature.items() if theirs.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: cache {a!r} vs model {b!r}" for k, (a, b) in diff.items())
            raise CacheMismatchError(
                f"this MeanCache was fitted on another model ({detail}); fit it on this model with "
                f"MeanCache.fit(model, tokens)"
            )

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors :meth:`save` writes (``fit_rows`` only where known)."""
        out = {
            "entry_pos": self.entry_pos,
            "entry_tok": self.entry_tok,
            "entry_count": self.entry_count,
            "cond_mean": self.cond_mean,
            "pos_mean": self.pos_mean,
            "z_mean": self.z_mean,
        }
        if self.fit_rows is not None:
            out["fit_rows"] = self.fit_rows
        return out

    @property
    def sha256(self) -> str:
        """Content hash of the means and their index: identifies a cache in intervention specs."""
        if self._sha is None:
            h = hashlib.sha256()
            for name, t in self.tensors().items():
                h.update(name.encode())
                h.update(t.contiguous().numpy().tobytes())
            self._sha = h.hexdigest()
        return self._sha

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeanCache) and self.sha256 == other.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return (
            f"MeanCache(n_layers={self.n_layers}, n_pos={self.n_pos}, entries={len(self.entry_pos)}, "
            f"n_prompts={self.n_prompts}, sha256={self.sha256[:12]})"
        )

    # --- persistence -------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the cache to ``path`` (safetensors; metadata as JSON strings; :mod:`interventions.cache_file`)."""
        path = Path(path)
        cache_file.write(path, self.tensors(), n_prompts=self.n_prompts, model_signature=self.model_signature,
                         sha256=self.sha256)
        self.source = str(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> MeanCache:
        """Read a cache written by :meth:`save`; verifies its metadata, the names, shapes, types and ranges of
        its tensors and its content hash. A file that is not such a cache raises
        :class:`~interventions.types.InterventionError` naming the file and what is wrong."""
        path = Path(path)
        tensors, n_prompts, signature, recorded = cache_file.read(path)
        cache = cls(**tensors, n_prompts=n_prompts, model_signature=signature, source=str(path))
        if recorded and recorded != cache.sha256:
            raise InterventionError(f"{path} is corrupt: its content hash does not match its metadata")
        return cache
