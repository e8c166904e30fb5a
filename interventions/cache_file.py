"""The file form of a :class:`~interventions.MeanCache`: safetensors with JSON metadata (never pickle).

:func:`write` saves the tensors of a cache with its metadata (format tag and version, fit prompt count,
model signature, content hash); :func:`read` checks the metadata and every tensor's name, rank, shape, dtype
and range before anything is built from it (a crafted file is refused in one line naming the file and what
is wrong: a huge token id would otherwise size the lookup table).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .types import InterventionError, JsonDict, JsonMapping

__all__ = ["CACHE_TENSORS", "FORMAT_VERSION", "MAX_VOCAB", "read", "tensor_problem", "write"]

FORMAT_VERSION = 2
"""Version 2 adds ``fit_rows`` (digests of the fit prompts); version-1 files load with ``fit_rows=None``."""

CACHE_TENSORS = ("entry_pos", "entry_tok", "entry_count", "cond_mean", "pos_mean", "z_mean")
"""The tensors every cache file holds (``fit_rows`` as well from format version 2)."""

MAX_VOCAB = 10_000_000
"""Largest token id a cache without ``d_vocab`` in its signature may hold (the lookup table is that wide)."""


def write(path: Path, tensors: dict[str, torch.Tensor], *, n_prompts: int, model_signature: JsonDict,
          sha256: str) -> None:
    """Write ``tensors`` to ``path`` (its folder is created) with the cache's metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "format": "af1-mean-cache",
        "format_version": str(FORMAT_VERSION),
        "n_prompts": str(n_prompts),
        "model_signature": json.dumps(model_signature, sort_keys=True),
        "sha256": sha256,
    }
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


def read(path: Path) -> tuple[dict[str, torch.Tensor], int, JsonDict, str | None]:
    """``(tensors, n_prompts, model_signature, recorded sha256)`` of the cache file at ``path``, all checked;
    :class:`~interventions.types.InterventionError` naming the file and what is wrong otherwise."""
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        raise FileNotFoundError(f"no MeanCache file at {path}")

    def bad(what: str) -> InterventionError:
        return InterventionError(f"{path} is not a valid MeanCache file: {what}; move it away or fit the means "
                                 f"again")

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:  # a corrupt header, an unreadable file
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
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:  # corrupt data, a dtype torch refuses
        raise bad(f"unreadable tensors ({' '.join(str(err).split())[:120]})") from None
    problem = tensor_problem(tensors, signature)
    if problem is not None:
        raise bad(problem)
    return tensors, n_prompts, signature, meta.get("sha256") or None


def tensor_problem(tensors: dict[str, torch.Tensor], signature: JsonMapping) -> str | None:
    """What is wrong with the tensors of a cache file (``None`` if nothing): names, ranks, shapes, types and
    the range of positions and token ids."""
    missing = [n for n in CACHE_TENSORS if n not in tensors]
    if missing:
        return f"tensor(s) {', '.join(missing)} missing"
    unknown = sorted(set(tensors) - {*CACHE_TENSORS, "fit_rows"})
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
