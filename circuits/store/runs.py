"""Output directories of long runs: identity check, crash-safe JSONL results, atomic JSON files.

A run directory holds ``run.json`` (the identity of the command that produced it: model, task, seed,
prompt count, threshold, ablation, ...), one append-only JSONL results file and summary files.

* Every result line is written whole with a single ``write`` on an ``O_APPEND`` descriptor, then
  flushed and ``fsync``-ed: a crash (even ``kill -9``) leaves at most one partial *last* line, which
  :meth:`RunDir.load_records` cuts off (and truncates from the file) when the run is resumed.
* Re-running the same command in the same directory resumes from the finished lines; a different
  command raises :class:`RunMismatchError` naming the differing parameters.
* JSON files (``run.json``, summaries) are replaced atomically (write to a temporary file, then rename).
* Files a resumed run reads back besides its results (the means cache) are named by their content hash
  in ``artifacts.json`` when written, and checked against it when read (:meth:`RunDir.checked_artifact`).
* Malformed files (a ``run.json`` that is not a JSON object, a results line that is not an object, deep
  nesting) raise :class:`~circuits.errors.CorruptRunError` naming the file and the line.

Locking is the runner's concern (:class:`circuits.store.lock.DirLock`, taken by :mod:`circuits.runner`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interventions.types import JsonMapping

if TYPE_CHECKING:
    import torch
    from jaxtyping import Int

from circuits.errors import CorruptRunError, RunMismatchError, one_line
from circuits.store import files
from interventions.types import JsonDict

RUN_KEY = files.IDENTITY
"""The entry of ``artifacts.json`` holding the SHA-256 of the run identity the artifacts belong to."""

__all__ = [
    "RunDir", "RunMismatchError", "append_line", "dist_version", "dumps_line",
    "file_sha256", "identity_diff", "read_json_object", "read_jsonl", "tokens_sha256", "write_json",
]


def _jsonable(value: object) -> Any:
    """``value`` with tuples as lists and non-finite floats as ``None`` (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def dumps_line(record: JsonMapping) -> str:
    """One JSONL line (compact, sorted keys, trailing newline)."""
    return json.dumps(_jsonable(record), sort_keys=True, allow_nan=False) + "\n"


def write_json(path: str | Path, obj: object) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically (:func:`circuits.store.atomic.write_bytes`: an
    exclusively created temporary file beside it, then ``os.replace``; a link at ``path`` is refused)."""
    from circuits.store.atomic import write_text

    text = json.dumps(_jsonable(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"
    return write_text(path, text)


def append_line(path: str | Path, record: JsonMapping) -> None:
    """Append ``record`` as one JSONL line: one ``write`` call, then flush and ``fsync``."""
    from circuits.store.atomic import no_link

    data = dumps_line(record).encode()
    fd = _open_no_follow(no_link(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        written = os.write(fd, data)
        if written != len(data):  # pragma: no cover - regular files write whole
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_no_follow(path: Path, flags: int) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (``O_NOFOLLOW``), naming the file."""
    from circuits.store.atomic import LinkError

    try:
        return os.open(str(path), flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:
        if err.errno == 40 or path.is_symlink():  # ELOOP: a link
            raise LinkError(f"{path} is a symbolic link: af1 writes only the files of its run directory, never "
                            f"through a link; remove the link or use a new --out directory") from None
        raise


def read_jsonl(path: str | Path, *, repair: bool = False, with_lines: bool = False) -> list[Any]:
    """The complete records of a JSONL file (``[]`` if missing).

    A trailing line without newline or that does not parse (left by an interrupted write) is ignored;
    with ``repair=True`` it is also truncated from the file so that later appends start on a fresh
    line. A bad line that is *not* the last, or a complete line that is not a JSON object, raises
    :class:`~circuits.errors.CorruptRunError` (a ``ValueError``: the file is corrupt).
    ``with_lines=True`` returns ``(line number, record)`` pairs (1-based) instead of records.
    """
    from circuits.store.atomic import no_link

    path = no_link(path)
    if not path.exists():
        return []
    fd = _open_no_follow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    records: list[Any] = []
    good_end = 0
    pos = 0
    line_no = 0
    while pos < len(raw):
        nl = raw.find(b"\n", pos)
        if nl < 0:  # partial last line
            break
        line = raw[pos:nl]
        line_no += 1
        if line.strip():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                if raw[nl + 1 :].strip():
                    raise CorruptRunError(
                        f"{path} is corrupt: line {line_no} is not valid JSON and is not the last "
                        f"line; move the file away or use a new --out directory"
                    ) from None
                break
            except ValueError as err:  # valid JSON that Python refuses (an integer of more than 4300 digits)
                raise CorruptRunError(f"{path}, line {line_no}: {one_line(err, 160)}; the file was not written by "
                                      f"af1: move it away or use a new --out directory") from None
            if not isinstance(record, dict):
                raise CorruptRunError(
                    f"{path}, line {line_no}: expected a JSON object, found {type(record).__name__}; the file "
                    f"was not written by af1: move it away or use a new --out directory"
                )
            records.append((line_no, record) if with_lines else record)
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(raw):
        fd = _open_no_follow(path, os.O_RDWR)
        try:
            os.ftruncate(fd, good_end)
            os.fsync(fd)
        finally:
            os.close(fd)
    return records


def read_json_object(path: str | Path) -> JsonDict:
    """The JSON object in ``path``; :class:`~circuits.errors.CorruptRunError` if it is not valid JSON
    or not an object (``[]``, a number, nesting too deep to parse)."""
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CorruptRunError(
            f"{path} is not valid JSON: cannot tell which command wrote {path.parent}; use a new --out "
            f"directory"
        ) from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise CorruptRunError(f"{path}: {one_line(err, 160)}; it was not written by af1: use a new --out "
                              f"directory") from None
    if not isinstance(obj, dict):
        raise CorruptRunError(
            f"{path} holds a JSON {type(obj).__name__}, not an object: it was not written by af1; use a new "
            f"--out directory"
        )
    return obj


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class RunDir:
    """An output directory tied to one command identity.

    ``identity`` holds the parameters that determine the results (model, task, seed, prompt count,
    threshold, ablation, ...); parameters that do not change them (grid, batch size, progress) must be
    left out so that, e.g., a full-grid run can resume an auto-grid run.
    """

    def __init__(self, path: str | Path, identity: JsonMapping, *, results_name: str = files.SEARCH_RESULTS,
                 optional: Iterable[str] = ()):
        self.path = Path(path)
        self.identity = _jsonable(dict(identity))
        self.results_path = self.path / results_name
        self.optional = frozenset(optional)
        """Keys compared only when both identities hold them: labels (the model's name, the task's) that the
        rest of the identity already pins down, and keys older releases recorded (the search's threshold)."""

    def open(self) -> RunDir:
        """Create the directory or check that it belongs to this command (raises
        :class:`RunMismatchError` otherwise), and record the identity in ``run.json``."""
        if self.path.exists() and not self.path.is_dir():
            raise RunMismatchError(f"--out {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        ident_path = self.path / files.IDENTITY
        if ident_path.exists():
            try:
                theirs = read_json_object(ident_path)
            except CorruptRunError as err:
                raise RunMismatchError(str(err)) from None
            diff = identity_diff(*comparable(theirs, self.identity, self.optional))
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

    def load_records(self) -> list[JsonDict]:
        """Finished result records (a partial last line is cut off the file)."""
        return read_jsonl(self.results_path, repair=True)

    def load_numbered_records(self) -> list[tuple[int, JsonDict]]:
        """:meth:`load_records` as ``(line number, record)`` pairs, for messages that name the line."""
        return read_jsonl(self.results_path, repair=True, with_lines=True)

    # --- artifacts: files read back on resume, named by content hash ---------------------------
    @property
    def identity_sha256(self) -> str:
        """Content hash of this run's identity: ``artifacts.json`` records it beside the artifacts' hashes,
        binding them to the run that wrote them. The optional keys (labels such as the model's name, which
        a run opened from Python may not give) are left out, so that every run allowed to resume a directory
        has the same hash."""
        bound = without_keys(self.identity, self.optional)
        return hashlib.sha256(json.dumps(bound, sort_keys=True, allow_nan=False).encode()).hexdigest()

    def record_artifact(self, name: str) -> str:
        """Record the SHA-256 of ``<dir>/name`` in ``artifacts.json`` (after writing the file), with the hash
        of this run's identity (entries bound to another identity are dropped)."""
        digest = file_sha256(self.path / name)
        recorded = self.artifacts()
        if recorded.get(RUN_KEY) != self.identity_sha256:
            recorded = {}
        self.write_json(files.ARTIFACTS, {**recorded, RUN_KEY: self.identity_sha256, name: digest})
        return digest

    def artifacts(self) -> dict[str, str]:
        """``{file name: sha256}`` recorded so far (empty when there is no ``artifacts.json``)."""
        path = self.path / files.ARTIFACTS
        if not path.exists():
            return {}
        obj = read_json_object(path)
        if not all(isinstance(v, str) for v in obj.values()):
            raise CorruptRunError(f"{path}: every value must be a SHA-256 string; use a new --out directory")
        return obj

    def checked_artifact(self, name: str) -> Path | None:
        """``<dir>/name`` if it exists and its content hash is the one recorded when it was written
        (``None`` if it does not exist). A file whose hash differs, or that exists without a record,
        raises :class:`~circuits.errors.CorruptRunError`: it is not the file this run wrote."""
        path = self.path / name
        if not path.exists():
            return None
        artifacts = self.artifacts()
        recorded = artifacts.get(name)
        if recorded is not None and artifacts.get(RUN_KEY) != self.identity_sha256:
            raise CorruptRunError(
                f"{path} and {files.ARTIFACTS} were written by another run (its run identity hash "
                f"{_short(artifacts.get(RUN_KEY))!s}, this run's {_short(self.identity_sha256)}): results resumed with "
                f"it would mix two runs; move both away to recompute them, or use a new --out directory"
            )
        if recorded is None:
            raise CorruptRunError(
                f"{path} was not written by this run (no content hash recorded in {files.ARTIFACTS}): move it "
                f"away to recompute it, or use a new --out directory"
            )
        actual = file_sha256(path)
        if actual != recorded:
            raise CorruptRunError(
                f"{path} changed since this run wrote it (SHA-256 {actual[:12]}..., recorded "
                f"{recorded[:12]}...): results resumed with it would mix two caches; restore the file, move "
                f"it away to recompute it, or use a new --out directory"
            )
        return path

    def append(self, record: JsonMapping) -> None:
        append_line(self.results_path, record)

    def write_json(self, name: str, obj: object) -> Path:
        return write_json(self.path / name, obj)

    def write_jsonl(self, name: str, records: Iterable[JsonMapping]) -> Path:
        """Write a whole JSONL file atomically (:func:`circuits.store.atomic.write_bytes`)."""
        from circuits.store.atomic import write_text

        return write_text(self.path / name, "".join(dumps_line(rec) for rec in records))


def comparable(old: JsonMapping, new: JsonMapping, optional: Iterable[str]) -> tuple[dict, dict]:
    """``old`` and ``new`` without the ``optional`` keys that only one of them holds (at the top level and in
    a nested ``meta`` object)."""
    optional = frozenset(optional)
    a, b = dict(old), dict(new)
    for k in optional:
        if (k in a) != (k in b):
            a.pop(k, None)
            b.pop(k, None)
    if optional and isinstance(a.get("meta"), Mapping) and isinstance(b.get("meta"), Mapping):
        a["meta"], b["meta"] = comparable(a["meta"], b["meta"], optional)
    return a, b


def without_keys(identity: JsonMapping, keys: Iterable[str]) -> JsonDict:
    """``identity`` without ``keys`` (at the top level and in a nested ``meta`` object)."""
    keys = frozenset(keys)
    out = {k: v for k, v in identity.items() if k not in keys}
    if keys and isinstance(out.get("meta"), Mapping):
        out["meta"] = without_keys(out["meta"], keys)
    return out


def identity_diff(old: JsonMapping, new: JsonMapping, prefix: str = "") -> str:
    """``"key: old -> new, ..."`` for every key whose value differs (missing counts as differing); nested
    objects are compared key by key (``means.fit.seed: 0 -> 1``) and content hashes shortened to 12 digits."""
    parts = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<missing>"), new.get(k, "<missing>")
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            parts.append(identity_diff(a, b, f"{prefix}{k}."))
        else:
            parts.append(f"{prefix}{k}: {_short(a)!r} -> {_short(b)!r}")
    return ", ".join(parts)


def _short(value: object) -> object:
    """A 64-digit hex hash as its first 12 digits and an ellipsis; anything else as it is."""
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "..."
    return value


def tokens_sha256(tokens: Int[torch.Tensor, "batch pos"], answers: Int[torch.Tensor, " batch *k"]) -> str:
    """Content hash of the evaluation prompts and answers (part of a run's identity)."""
    h = hashlib.sha256()
    h.update(str(tuple(tokens.shape)).encode())
    h.update(tokens.cpu().long().contiguous().numpy().tobytes())
    h.update(answers.cpu().long().contiguous().numpy().tobytes())
    return h.hexdigest()


def dist_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (e.g. ``"transformer-lens"``), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
