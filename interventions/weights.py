"""The content hash of a model's weights (what a run identity records of the model, beside its shapes; see
:meth:`interventions.adapter.ModelAdapter.weights_sha256`)."""

from __future__ import annotations

import hashlib
import os
import weakref

import torch

__all__ = ["weights_sha256"]

_WEIGHT_HASHES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple, str]] = weakref.WeakKeyDictionary()


def weights_sha256(module: torch.nn.Module) -> str | None:
    """SHA-256 over every tensor of ``module.state_dict()`` in name order: of the SHA-256 of each tensor's name,
    dtype, shape and bytes (tensors are hashed in parallel, up to 8 threads);
    ``None`` if a tensor is on the ``meta`` device. Cached per module under a key of every tensor's storage
    address and version counter, so it is computed once per load and again only after a weight changed."""
    state = module.state_dict(keep_vars=True)
    tensors = sorted((name, t) for name, t in state.items() if isinstance(t, torch.Tensor))
    if any(t.device.type == "meta" for _, t in tensors):
        return None
    key = tuple((name, t.data_ptr(), t._version, tuple(t.shape), str(t.dtype)) for name, t in tensors)
    cached = _WEIGHT_HASHES.get(module)
    if cached is not None and cached[0] == key:
        return cached[1]
    def tensor_digest(item: tuple[str, torch.Tensor]) -> bytes:
        name, t = item
        h = hashlib.sha256(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        with torch.no_grad():
            flat = t.detach().to("cpu").contiguous().reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        if flat.numel():
            # hashlib releases the GIL: tensors hash in parallel. ndarray exports the buffer protocol; numpy's
            # stub does not declare it.
            h.update(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]
        return h.digest()

    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(8, os.cpu_count() or 1, len(tensors)))
    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(tensor_digest, tensors))
    h = hashlib.sha256(b"af1-weights-v1")
    for part in parts:
        h.update(part)
    digest = h.hexdigest()
    _WEIGHT_HASHES[module] = (key, digest)
    return digest
