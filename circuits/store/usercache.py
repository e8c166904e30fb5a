"""The user's cache of results that repeat across commands: content-addressed, verified on reuse, bounded in size.

Fitting a run's means (10,000 prompts by default) and checking which prompts a model answers (up to
``--max-checked`` forward passes) cost seconds on a zoo model and minutes on a large one, and both are a function
of inputs that name them exactly: the model's weights, the prompts, the fit spec, the format and the package
version. So they are kept here, under the SHA-256 of that key, and every command (and the Python API, through the
runner) reuses them::

    $AF1_CACHE_DIR/results/<kind>/<key sha256>.bin     the entry's bytes (a safetensors file)
    $AF1_CACHE_DIR/results/<kind>/<key sha256>.json    {"key", "sha256" of the bytes, "bytes", "about"}

``AF1_CACHE_DIR`` defaults to ``~/.cache/af1-circuits`` (the folder of the GGUF conversions too). Both files are
written atomically (:func:`circuits.store.atomic.write_bytes`), the bytes first; an entry is used only when its
description names the same key and the bytes hash to the recorded SHA-256 (else it is removed, with a line, and
the result is computed again). The whole cache stays under :data:`LIMIT_ENV` megabytes (default
:data:`DEFAULT_LIMIT_MB`): after each write the least recently used entries are removed until it fits; ``0``
turns the cache off (nothing read, nothing written). Nothing is ever written outside ``results/`` of the cache
folder. ``af1 cache list`` and ``af1 cache clear`` show and empty it (:mod:`circuits.commands.cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.errors import ArgumentError
from circuits.logs import get_logger

if TYPE_CHECKING:
    from interventions.types import JsonMapping

__all__ = ["CACHE_ENV", "DEFAULT_LIMIT_MB", "KINDS", "LIMIT_ENV", "Entry", "cache_root", "clear", "discard", "entries",
           "evict", "get", "key_sha256", "limit_bytes", "put", "results_root"]

CACHE_ENV = "AF1_CACHE_DIR"
"""The cache folder (default ``~/.cache/af1-circuits``)."""
LIMIT_ENV = "AF1_CACHE_LIMIT_MB"
"""The size bound of the results cache in megabytes (``0``: no cache)."""
DEFAULT_LIMIT_MB = 4096
"""The size bound when :data:`LIMIT_ENV` is not set."""
KINDS = ("means", "prompts")
"""What the cache holds: fitted means (a :class:`~interventions.MeanCache` file) and prepared prompts (the base-correct
check and the fit set, :mod:`circuits.prompts.prepared`)."""
DATA, DESCRIPTION = ".bin", ".json"
FORMAT = 1
"""Version of the entries' layout (part of every key)."""


@dataclass(frozen=True)
class Entry:
    """One cached result: ``kind`` (:data:`KINDS`), ``key`` (the SHA-256 naming it), ``size`` (bytes of data and
    description), ``used`` (last use, seconds since the epoch), ``about`` (what it is, for ``af1 cache list``)."""

    kind: str
    key: str
    size: int
    used: float
    about: str
    path: Path


def cache_root() -> Path:
    """The cache folder: ``$AF1_CACHE_DIR``, else ``~/.cache/af1-circuits``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "af1-circuits").expanduser()


def results_root() -> Path:
    """The folder of the results cache inside :func:`cache_root`."""
    return cache_root() / "results"


def limit_bytes() -> int:
    """The size bound in bytes (:data:`LIMIT_ENV`; 0: the cache is off); an unreadable setting is one line."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT_MB * 2**20
    try:
        mb = float(text)
    except ValueError:
        raise ArgumentError(f"${LIMIT_ENV}={text!r} is not a number: give the cache's size bound in megabytes "
                            f"(0 turns the cache off)") from None
    if not mb >= 0:
        raise ArgumentError(f"${LIMIT_ENV}={text!r} is out of range: give megabytes >= 0 (0 turns the cache off)")
    return int(mb * 2**20)


def key_sha256(key: JsonMapping) -> str:
    """The SHA-256 (hex) naming ``key`` (a JSON object; keys sorted, so equal objects name one entry)."""
    text = json.dumps({"format": FORMAT, **key}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _paths(kind: str, key: JsonMapping) -> tuple[Path, Path, str]:
    if kind not in KINDS:
        raise ValueError(f"unknown cache kind {kind!r}")
    name = key_sha256(key)
    folder = results_root() / kind
    return folder / (name + DATA), folder / (name + DESCRIPTION), name


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def get(kind: str, key: JsonMapping) -> bytes | None:
    """The bytes cached under ``key``, verified: ``None`` when the cache is off or holds no such entry; an entry whose
    bytes do not hash to the recorded SHA-256 (or whose description names another key) is removed, with a line,
    and ``None`` returned (the caller computes the result again)."""
    if limit_bytes() == 0:
        return None
    data_path, desc_path, name = _paths(kind, key)
    if not desc_path.is_file() or not data_path.is_file() or data_path.is_symlink() or desc_path.is_symlink():
        return None
    try:
        desc = json.loads(desc_path.read_text())
        data = data_path.read_bytes()
    except (OSError, ValueError):
        desc, data = None, b""
    if not isinstance(desc, dict) or _canonical(desc.get("key")) != _canonical(dict(key)) or \
            hashlib.sha256(data).hexdigest() != desc.get("sha256"):
        get_logger("cache").warning("cached %s %s... does not match its recorded hash (changed on disk): removed; "
                                    "computing it again", kind, name[:12])
        _remove(desc_path, data_path)
        return None
    now = time.time()
    try:
        os.utime(desc_path, (now, now))  # least recently used is evicted first
    except OSError:
        pass
    return data


def put(kind: str, key: JsonMapping, data: bytes, about: str) -> Path | None:
    """Keep ``data`` under ``key`` (atomically: the bytes, then the description), then evict the least recently used
    entries beyond the size bound; ``about`` says what it is. Returns the data file (``None``: the cache is off, or
    the entry alone exceeds the bound). A failed write (a full disk, a read-only folder) is a line, never an
    error: the run goes on without the cache."""
    from circuits.store.atomic import write_bytes

    limit = limit_bytes()
    if limit == 0 or len(data) > limit:
        return None
    data_path, desc_path, _ = _paths(kind, key)
    desc = {"key": dict(key), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "about": about}
    try:
        write_bytes(data_path, data)
        write_bytes(desc_path, json.dumps(desc, sort_keys=True, default=str).encode())
    except OSError as err:
        get_logger("cache").warning("could not keep the %s in the cache %s (%s): the next command computes them "
                                    "again", kind, results_root(), err)
        return None
    evict(limit)
    return data_path


def discard(kind: str, key: JsonMapping) -> None:
    """Remove the entry of ``key`` (one whose content proved wrong)."""
    data_path, desc_path, _ = _paths(kind, key)
    _remove(desc_path, data_path)


def entries() -> list[Entry]:
    """Every entry of the cache, least recently used first."""
    out = []
    for kind in KINDS:
        folder = results_root() / kind
        if not folder.is_dir() or folder.is_symlink():
            continue
        for desc_path in folder.glob("*" + DESCRIPTION):
            data_path = desc_path.with_suffix(DATA)
            try:
                desc = json.loads(desc_path.read_text())
                size = desc_path.stat().st_size + (data_path.stat().st_size if data_path.is_file() else 0)
                used = desc_path.stat().st_mtime
            except (OSError, ValueError):
                continue
            about = str(desc.get("about", "")) if isinstance(desc, dict) else ""
            out.append(Entry(kind, desc_path.stem, size, used, about, data_path))
    return sorted(out, key=lambda e: e.used)


def evict(limit: int) -> list[Entry]:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes; returns them."""
    found = entries()
    total = sum(e.size for e in found)
    removed = []
    for e in found:
        if total <= limit:
            break
        _remove(e.path, e.path.with_suffix(DESCRIPTION))
        total -= e.size
        removed.append(e)
    return removed


def clear(kind: str | None = None) -> list[Entry]:
    """Remove every entry (of ``kind``, or of every kind), and temporaries a killed write left; returns the
    entries removed."""
    from circuits.store.atomic import TMP_SUFFIX

    removed = [e for e in entries() if kind is None or e.kind == kind]
    for e in removed:
        _remove(e.path, e.path.with_suffix(DESCRIPTION))
    for k in KINDS if kind is None else (kind,):
        folder = results_root() / k
        if folder.is_dir() and not folder.is_symlink():
            for p in folder.iterdir():
                if p.name.endswith(TMP_SUFFIX) or (p.suffix == DATA and not p.with_suffix(DESCRIPTION).exists()):
                    p.unlink(missing_ok=True)
    return removed


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError:
            pass
