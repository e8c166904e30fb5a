"""Output directories of long runs: identity check, crash-safe JSONL results, atomic JSON files.

A run directory holds ``run.json`` (the identity of the command that produced it: model, task, seed,
prompt count, threshold, ablation, ...), one append-only JSONL results file and summary files.

* Every result line is written whole with a single ``write`` on an ``O_APPEND`` descriptor, then
  flushed and ``fsync``-ed: a crash (even ``kill -9``) leaves at most one partial *last* line, which
  :meth:`RunDir.load_records` cuts off (and truncates from the file) when the run is resumed.
* Re-running the same command in the same directory resumes from the finished lines; a different
  command raises :class:`RunMismatchError` naming the differing parameters.
* JSON files (``run.json``, summaries) are replaced atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

IDENTITY_FILE = "run.json"


class RunMismatchError(FileExistsError):
    """The output directory holds results of a different command."""


def _jsonable(value: Any) -> Any:
    """``value`` with tuples as lists and non-finite floats as ``None`` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def dumps_line(record: Mapping[str, Any]) -> str:
    """One JSONL line (compact, sorted keys, trailing newline)."""
    return json.dumps(_jsonable(record), sort_keys=True, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (temporary file + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(_jsonable(obj), f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def append_line(path: str | Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one JSONL line: one ``write`` call, then flush and ``fsync``."""
    data = dumps_line(record).encode()
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - regular files write whole
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """The complete records of a JSONL file (``[]`` if missing).

    A trailing line without newline or that does not parse (left by an interrupted write) is ignored;
    with ``repair=True`` it is also truncated from the file so that later appends start on a fresh
    line. A bad line that is *not* the last raises ``ValueError`` (the file is corrupt).
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    records: list[dict[str, Any]] = []
    good_end = 0
    pos = 0
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        if nl < 0:  # partial last line
            break
        line = raw[pos:nl]
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if raw[nl + 1 :].strip():
                    raise ValueError(
                        f"{path} is corrupt: line {len(records) + 1} is not valid JSON and is not the last "
                        f"line; move the file away or use a new --out directory"
                    ) from None
                break
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return records


class RunDir:
    """An output directory tied to one command identity.

    ``identity`` holds the parameters that determine the results (model, task, seed, prompt count,
    threshold, ablation, ...); parameters that do not change them (grid, batch size, progress) must be
    left out so that, e.g., a full-grid run can resume an auto-grid run.
    """

    def __init__(self, path: str | Path, identity: Mapping[str, Any], *, results_name: str = "results.jsonl"):
        self.path = Path(path)
        self.identity = _jsonable(dict(identity))
        self.results_path = self.path / results_name

    def open(self) -> "RunDir":
        """Create the directory or check that it belongs to this command (raises
        :class:`RunMismatchError` otherwise), and record the identity in ``run.json``."""
        if self.path.exists() and not self.path.is_dir():
            raise RunMismatchError(f"--out {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        ident_path = self.path / IDENTITY_FILE
        if ident_path.exists():
            try:
                theirs = json.loads(ident_path.read_text())
            except json.JSONDecodeError:
                raise RunMismatchError(
                    f"{ident_path} is not valid JSON: cannot tell which command wrote {self.path}; "
                    f"use a new --out directory"
                ) from None
            diff = identity_diff(theirs, self.identity)
            if diff:
                raise RunMismatchError(
                    f"output directory {self.path} holds results of a different command "
                    f"(differing parameters: {diff}); use a new --out directory, or delete {self.path} "
                    f"to start over"
                )
        elif self.results_path.exists() and self.results_path.stat().st_size > 0:
            raise RunMismatchError(
                f"{self.results_path} exists but {ident_path} does not: cannot tell which command "
                f"wrote it; use a new --out directory"
            )
        else:
            write_json(ident_path, self.identity)
        return self

    def load_records(self) -> list[dict[str, Any]]:
        """Finished result records (a partial last line is cut off the file)."""
        return read_jsonl(self.results_path, repair=True)

    def append(self, record: Mapping[str, Any]) -> None:
        append_line(self.results_path, record)

    def write_json(self, name: str, obj: Any) -> Path:
        return write_json(self.path / name, obj)

    def write_jsonl(self, name: str, records: Iterable[Mapping[str, Any]]) -> Path:
        """Write a whole JSONL file atomically."""
        path = self.path / name
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        with open(tmp, "w") as f:
            for rec in records:
                f.write(dumps_line(rec))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``"key: old -> new, ..."`` for every key whose value differs (missing counts as differing)."""
    keys = sorted(set(old) | set(new))
    parts = [f"{k}: {old.get(k, '<missing>')!r} -> {new.get(k, '<missing>')!r}" for k in keys if old.get(k) != new.get(k)]
    return ", ".join(parts)
