"""The header of a GGUF file checked before any reader sees it: a file truncated inside its header, or one that
declares more tensors or metadata entries than its bytes can hold, is one :class:`~circuits.errors.ModelLoadError`
line naming the file and what is wrong, never an internal error (or an allocation sized by a forged count) from
the reader. Torch-free, no ``gguf`` package needed.

The layout (GGUF versions 2 and 3, little-endian): ``GGUF``, ``uint32`` version, ``uint64`` tensor count, ``uint64``
metadata count; the metadata entries (a string key, a ``uint32`` value type, the value: a scalar, a string
``uint64`` length + bytes, or an array ``uint32`` type + ``uint64`` count + elements); then each tensor's info (a
string name, ``uint32`` rank, ``uint64`` per dimension, ``uint32`` type, ``uint64`` offset into the data).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from circuits.errors import ModelLoadError

__all__ = ["MAX_COUNT", "MAX_DEPTH", "MAX_RANK", "GGUFHeader", "check_header"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""The GGUF versions transformers reads."""
MAX_COUNT = 1 << 24
"""Most tensors, metadata entries or array elements a header may declare (llama.cpp's largest models hold a few
thousand tensors; a tokenizer's vocabulary some hundred thousand strings)."""
MAX_RANK = 8
"""Most dimensions of a tensor."""
MAX_DEPTH = 4
"""Most arrays nested in one another in a metadata value."""
SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Value type -> bytes, for the fixed-size types (uint8 .. float64); 8 is a string, 9 an array."""
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """What the header declares: ``version``, ``n_tensors``, ``n_metadata`` and ``header_bytes`` (where the
    tensor infos end)."""

    version: int
    n_tensors: int
    n_metadata: int
    header_bytes: int


class _Truncated(Exception):
    """A read past the end of the file."""


def check_header(path: str | os.PathLike) -> GGUFHeader:
    """Walk the header of the GGUF file ``path`` without reading its tensor data: :class:`ModelLoadError` naming the
    file when it is not GGUF, of a version transformers cannot read, truncated inside its header, declares absurd
    counts (beyond :data:`MAX_COUNT` or what its size can hold), or places a tensor past its end."""
    path = Path(path)
    size = path.stat().st_size
    if size < 24:
        raise ModelLoadError(f"{path.name} is not a GGUF file: {size} bytes, fewer than a GGUF header's 24")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != MAGIC:
            raise ModelLoadError(f"{path.name} is not a GGUF file: it starts with {bytes(data[:4])!r}, not b'GGUF'")
        version, n_tensors, n_metadata = struct.unpack_from("<IQQ", data, 4)
        if version not in VERSIONS:
            raise ModelLoadError(f"{path.name}: GGUF version {version} is not one transformers reads "
                                 f"({', '.join(map(str, VERSIONS))}); convert it again with a current llama.cpp")
        for what, count, least in (("tensors", n_tensors, 8 + 4 + 4 + 8), ("metadata entries", n_metadata, 8 + 4)):
            if count > MAX_COUNT or count * least > size:
                raise ModelLoadError(f"{path.name} declares {count} {what}, more than its {size} bytes can hold: "
                                     f"the file is corrupt or not a GGUF checkpoint")
        try:
            end = _walk(data, size, n_tensors, n_metadata, path.name)
        except _Truncated:
            raise ModelLoadError(f"{path.name} is truncated inside its header ({size} bytes): download or copy "
                                 f"it again") from None
    return GGUFHeader(version, n_tensors, n_metadata, end)


def _walk(data: mmap.mmap, size: int, n_tensors: int, n_metadata: int, name: str) -> int:
    """The offset where the tensor infos end, checking every length against ``size``."""
    pos = 24

    def take(n: int) -> int:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise _Truncated
        start, pos = pos, pos + n
        return start

    def u32() -> int:
        return int(struct.unpack_from("<I", data, take(4))[0])

    def u64() -> int:
        return int(struct.unpack_from("<Q", data, take(8))[0])

    def string() -> None:
        take(u64())

    def value(kind: int, depth: int) -> None:
        if kind in SCALARS:
            take(SCALARS[kind])
        elif kind == STRING:
            string()
        elif kind == ARRAY:
            if depth >= MAX_DEPTH:
                raise ModelLoadError(f"{name}: a metadata value nests arrays deeper than {MAX_DEPTH}: the file is "
                                     f"corrupt or not a GGUF checkpoint")
            inner, count = u32(), u64()
            if count > MAX_COUNT:
                raise ModelLoadError(f"{name}: a metadata array declares {count} elements (at most {MAX_COUNT}): "
                                     f"the file is corrupt")
            if inner in SCALARS:
                take(SCALARS[inner] * count)
            else:
                for _ in range(count):
                    value(inner, depth + 1)
        else:
            raise ModelLoadError(f"{name}: metadata value type {kind} is not a GGUF type: the file is corrupt")

    for _ in range(n_metadata):
        string()
        value(u32(), 0)
    for _ in range(n_tensors):
        string()
        rank = u32()
        if rank > MAX_RANK:
            raise ModelLoadError(f"{name}: a tensor declares {rank} dimensions (at most {MAX_RANK}): the file is "
                                 f"corrupt")
        for _ in range(rank):
            u64()
        u32()
        if u64() > size:
            raise ModelLoadError(f"{name}: a tensor's data starts past the end of the file ({size} bytes): the file "
                                 f"is truncated; download or copy it again")
    return pos
