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
a mean it contributes to: fit on a separate set, see ``circuits.fitset``), and :meth:`MeanCache.coverage`
counts the fit prompts behind every mean a set of prompts would read.

All means are stored in float32 and accumulated in float64. Memory of the conditional means is
``n_layers * n_entries * d_model * 4`` bytes, where ``n_entries`` is the number of distinct
``(position, token)`` pairs in the fit set; e.g. Llama-3-8B (32 blocks, d_model 4096) on a two-operand
task with 1000 distinct operand values per position: ``32 * ~2003 * 4096 * 4 B = 1.05 GB``.

Files are safetensors with JSON metadata (never pickle).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from . import adapter as hooks
from .adapter import ModelAdapter, adapt
from .coverage import Coverage, row_digests, token_text
from .types import CacheMismatchError, InterventionError, Tokens
from .validation import check_layout, check_positive, check_tokens, special_token_ids

FORMAT_VERSION = 2
"""Version 2 adds ``fit_rows`` (digests of the fit prompts); version-1 files load with ``fit_rows=None``."""


class MeanCache:
    """Per-layer, per-position (and per-token) activation means of one prompt layout.

    Build with :meth:`fit`; read with :meth:`mean`; persist with :meth:`save` / :meth:`load`.
    """

    def __init__(
        self,
        *,
        entry_pos: Int[torch.Tensor, "n_entries"],
        entry_tok: Int[torch.Tensor, "n_entries"],
        entry_count: Int[torch.Tensor, "n_entries"],
        cond_mean: Float[torch.Tensor, "n_layers n_entries d_model"],
        pos_mean: Float[torch.Tensor, "n_layers n_pos d_model"],
        z_mean: Float[torch.Tensor, "n_layers n_pos n_heads d_head"],
        n_prompts: int,
        model_signature: dict[str, Any],
        source: str | None = None,
        fit_rows: Int[torch.Tensor, "n_prompts"] | None = None,
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
        model: Any,
        tokens: Tokens,
        *,
        batch_size: int = 64,
        progress: bool = True,
    ) -> "MeanCache":
        """Fit the means on ``tokens`` (``[batch, pos]`` long, one layout, BOS at position 0).

        Streams over batches of ``batch_size`` prompts: per batch the backend returns the activations
        (``adapt(model).activations``: every block's residual, and its ``hook_z`` already summed over the
        batch; on a remote backend they are downloaded) and the sums are accumulated here, so the
        residuals of one batch are held at once.
        """
        ad = adapt(model)
        info = ad.info
        tokens = check_tokens(tokens, d_vocab=info.d_vocab)
        check_positive("batch_size", batch_size)
        bos_id, pad_id = special_token_ids(ad.model)
        check_layout(tokens, bos_id=bos_id, pad_id=pad_id)
        n, n_pos = tokens.shape
        # Entries: the distinct (position, token) pairs of the fit set, sorted by position then token.
        key = torch.arange(n_pos).unsqueeze(0) * info.d_vocab + tokens.cpu()
        uniq, inverse = torch.unique(key, return_inverse=True)
        entry_pos, entry_tok = uniq // info.d_vocab, uniq % info.d_vocab
        entry_count = torch.bincount(inverse.flatten(), minlength=len(uniq))

        device = ad.device()
        f64 = torch.float64
        cond_sum = torch.zeros(info.n_layers, len(uniq), info.d_model, dtype=f64, device=device)
        pos_sum = torch.zeros(info.n_layers, n_pos, info.d_model, dtype=f64, device=device)
        z_sum = torch.zeros(info.n_layers, n_pos, info.n_heads, info.d_head, dtype=f64, device=device)
        inverse = inverse.to(device)
        names = [hooks.resid_post(layer) for layer in range(info.n_layers)]
        summed = [hooks.z(layer) for layer in range(info.n_layers)]
        with torch.inference_mode():
            for start in tqdm(range(0, n, batch_size), desc="MeanCache.fit", unit="batch", disable=not progress):
                # Activations come back from the backend (a remote backend sends them), sums are kept here.
                acts = ad.activations(tokens[start : start + batch_size].to(device), names, summed=summed)
                idx = inverse[start : start + batch_size].reshape(-1)
                for layer in range(info.n_layers):
                    a = acts[hooks.resid_post(layer)].to(device=device, dtype=f64)
                    cond_sum[layer].index_add_(0, idx, a.reshape(-1, info.d_model))
                    pos_sum[layer] += a.sum(0)
                    z_sum[layer] += acts[hooks.z(layer)].to(device=device, dtype=f64)

        counts = entry_count.to(device=device, dtype=f64)
        return cls(
            entry_pos=entry_pos,
            entry_tok=entry_tok,
            entry_count=entry_count,
            cond_mean=(cond_sum / counts[None, :, None]).float().cpu(),
            pos_mean=(pos_sum / n).float().cpu(),
            z_mean=(z_sum / n).float().cpu(),
            n_prompts=n,
            model_signature={**info.signature(), "fingerprint": ad.fingerprint()},
            fit_rows=row_digests(tokens),
        )

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

    def mean(self, layer: int, position: int, token: int | None = None) -> Float[torch.Tensor, "d_model"]:
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

    def contains(self, tokens: Tokens) -> torch.Tensor:
        """``[batch]`` bool: which prompts of ``tokens`` were in the fit set (by digest). Raises
        :class:`CacheMismatchError` for a cache saved before fit digests were kept (format version 1)."""
        if self.fit_rows is None:
            raise CacheMismatchError(
                "this MeanCache does not record which prompts it was fitted on (written by an earlier version): "
                "refit it with MeanCache.fit on a fit set that excludes the prompts you score"
            )
        return torch.isin(row_digests(tokens), self.fit_rows)

    def describe_entry(self, position: int, token: int, tokenizer: Any = None) -> str:
        """``"'7' (id 10) at position 1"`` (the id alone without a tokenizer)."""
        return f"{token_text(tokenizer, token)} at position {position}"

    def _entry(self, pos: int, token: int) -> int:
        hit = torch.nonzero((self.entry_pos == pos) & (self.entry_tok == token)).flatten()
        if len(hit) == 0:
            raise CacheMismatchError(
                f"the cache never saw token {token} at position {pos} (it saw "
                f"{int((self.entry_pos == pos).sum())} distinct tokens there): fit the cache on "
                f"prompts that cover every (position, token) pair you evaluate"
            )
        return int(hit[0])

    def entry_index(self, tokens: Tokens, *, positions_from: int = 1) -> Int[torch.Tensor, "batch pos"]:
        """Entry index of every ``(position, token)`` of ``tokens`` (``-1`` before ``positions_from``).

        Raises :class:`CacheMismatchError` naming the position, token and lengths when the layout
        differs from the fit layout or a pair was never seen.
        """
        return self.indexer()(tokens, positions_from=positions_from)

    def indexer(self) -> "EntryIndexer":
        """The ``(position, token) -> entry`` lookup alone (small: ``n_pos x`` largest token id), for hooks that
        should not carry the whole cache (a remote request ships what its hooks hold)."""
        if self._lookup is None:
            width = int(self.entry_tok.max()) + 1 if len(self.entry_tok) else 1
            table = torch.full((self.n_pos, width), -1, dtype=torch.long)
            table[self.entry_pos, self.entry_tok] = torch.arange(len(self.entry_pos))
            self._lookup = EntryIndexer(table, self.n_prompts)
        return self._lookup

    def layer(self, name: str, layer: int) -> torch.Tensor:
        """A copy of ``cond_mean``, ``pos_mean`` or ``z_mean`` of block ``layer`` (0-indexed) that shares no
        storage with the cache (so a hook holding it carries one block's means, not every block's). One
        copy per block (memoised): the configurations of one wait in one request share it."""
        self.check_layer(layer)
        if (name, layer) not in self._layer_copies:
            self._layer_copies[name, layer] = getattr(self, name)[layer].clone()
        return self._layer_copies[name, layer]

    def on(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``cond_mean``, ``pos_mean`` or ``z_mean`` on ``device``/``dtype`` (memoised)."""
        key = (name, torch.device(device), dtype)
        if key not in self._device_copies:
            self._device_copies[key] = getattr(self, name).to(device=device, dtype=dtype)
        return self._device_copies[key]

    # --- identity ----------------------------------------------------------------------------
    def check_model(self, model: Any) -> None:
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
        """Write the cache to ``path`` (safetensors; metadata as JSON strings)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {
            "format": "af1-mean-cache",
            "format_version": str(FORMAT_VERSION),
            "n_prompts": str(self.n_prompts),
            "model_signature": json.dumps(self.model_signature, sort_keys=True),
            "sha256": self.sha256,
        }
        save_file({k: v.contiguous() for k, v in self.tensors().items()}, str(path), metadata=metadata)
        self.source = str(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "MeanCache":
        """Read a cache written by :meth:`save`; verifies its metadata, the names, shapes, types and ranges of
        its tensors and its content hash. A file that is not such a cache raises
        :class:`~interventions.types.InterventionError` naming the file and what is wrong."""
        from safetensors import safe_open

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no MeanCache file at {path}")

        def bad(what: str) -> InterventionError:
            return InterventionError(f"{path} is not a valid MeanCache file: {what}; move it away or fit the means "
                                     f"again")

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except Exception as err:  # noqa: BLE001 - safetensors' own error type for a corrupt header
            raise bad(f"unreadable safetensors header ({' '.join(str(err).split())[:120]})") from None
        if meta.get("format") != "af1-mean-cache":
            raise InterventionError(f"{path} is not a MeanCache file (metadata format={meta.get('format')!r})")
        try:
            n_prompts = int(meta["n_prompts"])
        except (KeyError, ValueError, TypeError):
            raise bad(f"metadata n_prompts = {meta.get('n_prompts')!r} is not an integer") from None
        if not 1 <= n_prompts <= 10**9:
            raise bad(f"metadata n_prompts = {n_prompts} is out of range")
        try:
            signature = json.loads(meta["model_signature"])
        except (KeyError, ValueError, TypeError, RecursionError):
            raise bad("metadata model_signature is missing or not JSON") from None
        if not isinstance(signature, dict):
            raise bad("metadata model_signature is not a JSON object")
        try:
            tensors = load_file(str(path))
        except Exception as err:  # noqa: BLE001
            raise bad(f"unreadable tensors ({' '.join(str(err).split())[:120]})") from None
        problem = _tensor_problem(tensors, signature)
        if problem is not None:
            raise bad(problem)
        cache = cls(**tensors, n_prompts=n_prompts, model_signature=signature, source=str(path))
        if meta.get("sha256") and meta["sha256"] != cache.sha256:
            raise InterventionError(f"{path} is corrupt: its content hash does not match its metadata")
        return cache


_CACHE_TENSORS = ("entry_pos", "entry_tok", "entry_count", "cond_mean", "pos_mean", "z_mean")
MAX_VOCAB = 10_000_000
"""Largest token id a cache without ``d_vocab`` in its signature may hold (the lookup table is that wide)."""


def _tensor_problem(tensors: dict[str, torch.Tensor], signature: dict[str, Any]) -> str | None:
    """What is wrong with the tensors of a cache file (``None`` if nothing): names, ranks, shapes, types and
    the range of positions and token ids."""
    missing = [n for n in _CACHE_TENSORS if n not in tensors]
    if missing:
        return f"tensor(s) {', '.join(missing)} missing"
    unknown = sorted(set(tensors) - {*_CACHE_TENSORS, "fit_rows"})
    if unknown:
        return f"unknown tensor(s) {', '.join(unknown)}"
    ranks = {"entry_pos": 1, "entry_tok": 1, "entry_count": 1, "cond_mean": 3, "pos_mean": 3, "z_mean": 4,
             "fit_rows": 1}
    for name, t in tensors.items():
        if t.ndim != ranks[name]:
            return f"tensor {name} has shape {list(t.shape)}, expected {ranks[name]} dimensions"
        floating = name.endswith("_mean")
        if t.is_floating_point() != floating or t.dtype == torch.bool:
            return f"tensor {name} has dtype {t.dtype}, expected {'floating point' if floating else 'integers'}"
    n_layers, n_pos, d_model = tensors["pos_mean"].shape
    n_entries = tensors["entry_pos"].shape[0]
    expect = {"entry_tok": [n_entries], "entry_count": [n_entries], "cond_mean": [n_layers, n_entries, d_model]}
    for name, shape in expect.items():
        if list(tensors[name].shape) != shape:
            return f"tensor {name} has shape {list(tensors[name].shape)}, expected {shape}"
    z = tensors["z_mean"]
    if list(z.shape[:2]) != [n_layers, n_pos]:
        return f"tensor z_mean has shape {list(z.shape)}, expected [{n_layers}, {n_pos}, n_heads, d_head]"
    if min(n_layers, n_pos, d_model) < 1:
        return f"tensor pos_mean has an empty shape {list(tensors['pos_mean'].shape)}"
    for key, value in (("n_layers", n_layers), ("d_model", d_model), ("n_heads", z.shape[2]), ("d_head", z.shape[3])):
        if key in signature and signature[key] != value:
            return f"its tensors have {key} {value}, its model_signature {signature[key]!r}"
    d_vocab = signature.get("d_vocab")
    limit = d_vocab if isinstance(d_vocab, int) and not isinstance(d_vocab, bool) and 0 < d_vocab <= MAX_VOCAB \
        else MAX_VOCAB
    if n_entries:
        pos, tok, count = tensors["entry_pos"], tensors["entry_tok"], tensors["entry_count"]
        if int(pos.min()) < 0 or int(pos.max()) >= n_pos:
            return f"entry_pos holds positions outside 0..{n_pos - 1}"
        if int(tok.min()) < 0 or int(tok.max()) >= limit:
            return f"entry_tok holds token ids outside 0..{limit - 1} (largest {int(tok.max())})"
        if int(count.min()) < 1:
            return "entry_count holds counts below 1"
    return None


class EntryIndexer:
    """``(position, token) -> entry`` of a :class:`MeanCache` (:meth:`MeanCache.indexer`): ``table`` is
    ``[n_pos, width]`` long, ``-1`` for pairs the ``n_prompts`` fit prompts never held."""

    def __init__(self, table: Int[torch.Tensor, "n_pos width"], n_prompts: int):
        self.table = table
        self.n_pos = int(table.shape[0])
        self.n_prompts = int(n_prompts)

    def __call__(self, tokens: Tokens, *, positions_from: int = 1) -> Int[torch.Tensor, "batch pos"]:
        """:meth:`MeanCache.entry_index`."""
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
            b, p = (int(v) for v in missing[0])
            raise CacheMismatchError(
                f"token {int(toks[b, p])} at position {p} (prompt {b} of the batch, length "
                f"{self.n_pos}) never occurred at that position in the {self.n_prompts} fit prompts; "
                f"{len(missing)} (prompt, position) pairs are uncovered: refit the cache on a set "
                f"that covers them"
            )
        idx[:, :positions_from] = -1
        return idx.to(tokens.device)
