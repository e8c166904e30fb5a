"""Writing inside a run directory and nowhere else.

Every whole-file write of the toolkit (``run.json``, summaries, reports, ``table.csv``, ``table.md``,
``figures/*.svg``, ``prompts.jsonl``) goes through :func:`write_bytes`: the data goes to a temporary file
with an unpredictable name, created exclusively (``O_EXCL``, :func:`tempfile.mkstemp`) beside its target,
is fsynced and then renamed over the target (``os.replace`` replaces a symbolic link itself, never the
file it points to). A target that is a symbolic link is refused: the toolkit never writes through a link
it did not create. A temporary file left by a killed process (its name ends in :data:`TMP_SUFFIX`) is
removed by the next command that takes the directory's lock (:func:`clean_temporaries`).

:func:`refuse_links` refuses a run directory that holds symbolic links, and :func:`safe_name` a name that
comes from data (a task, a model, an ablation) and would not be one plain path component.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from circuits.errors import RunDirError
from circuits.store import files

TMP_SUFFIX = ".af1tmp"
"""Ending of every temporary file the toolkit creates."""

_OLD_TMP = re.compile(r"^\..+\.tmp\d*$")
"""Temporary names of earlier versions (``.NAME.tmp`` and ``.NAME.tmp<PID>``)."""

__all__ = ["TMP_SUFFIX", "clean_temporaries", "inside", "no_link", "refuse_links", "safe_name", "write_bytes",
           "write_files", "write_text", "write_with"]


class LinkError(RunDirError):
    """A file or directory the toolkit would write is a symbolic link it did not create."""


def no_link(path: str | Path) -> Path:
    """``path``, unless it is a symbolic link (then :class:`LinkError` naming it)."""
    path = Path(path)
    if path.is_symlink():
        raise LinkError(f"{path} is a symbolic link: af1 writes only the files of its run directory, never through "
                        f"a link; remove the link or use a new --out directory")
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: an exclusively created temporary file beside it (unpredictable
    name), fsynced, then ``os.replace``-d over ``path``. ``path`` must not be a symbolic link."""
    path = no_link(path)
    if not path.parent.is_dir():
        no_link(path.parent)
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


def io_failure(err: BaseException) -> bool:
    """Whether a library writer's non-``OSError`` exception reports a failed write: safetensors raises its own
    type (or a ``RuntimeError``) saying ``Error while serializing: IoError(Os { code: 28, ... })`` for a full
    disk. :func:`write_with` and :func:`write_files` report those as ``OSError``; any other exception of a writer
    is a bug and surfaces as itself."""
    text = str(err)
    return "IoError" in text or "os error" in text.lower()


def write_with(path: str | Path, writer: Callable[[Path], object]) -> Path:
    """Like :func:`write_bytes`, for a library that writes files itself: ``writer(tmp)`` writes the
    exclusively created temporary file beside ``path``, which is then fsynced and renamed over ``path``. A
    failure while writing (a full disk) is an :class:`OSError` naming ``path``; the temporary file is
    removed."""
    path = no_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.close(fd)
    try:
        _call_writer(writer, Path(tmp), str(path))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _call_writer(writer: Callable[[Path], object], tmp: Path, what: str) -> None:
    """``writer(tmp)``; a library's report of a failed write (:func:`io_failure`) becomes an :class:`OSError`
    saying ``cannot write {what}``, any other exception propagates as it is."""
    try:
        writer(tmp)
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - re-raised unless a library's report of a failed write
        if not io_failure(err):
            raise
        raise OSError(f"cannot write {what}: {' '.join(str(err).split())}") from err


def write_files(folder: str | Path, writer: Callable[[Path], object]) -> list[Path]:
    """Like :func:`write_with`, for a library that writes several files into a folder (``save_pretrained``):
    ``writer(tmp)`` writes them into an exclusively created temporary folder inside ``folder``; each file is
    then fsynced and renamed over its name in ``folder`` (a link there is refused). Returns the files written;
    the temporary folder is removed in any case."""
    import shutil

    folder = no_link(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".files.", suffix=TMP_SUFFIX))
    try:
        _call_writer(writer, tmp, f"into {folder}")
        out = []
        for p in sorted(tmp.iterdir()):
            if p.is_file() and not p.is_symlink():
                target = no_link(folder / p.name)
                with open(p, "rb+") as f:
                    os.fsync(f.fileno())
                os.chmod(p, 0o644)
                os.replace(p, target)
                out.append(target)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def clean_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporary files (and :func:`write_files` folders) a killed command left in ``directory`` and its
    ``figures/`` folder (names ending in :data:`TMP_SUFFIX`, and ``.NAME.tmp[PID]`` of earlier versions); returns
    what was removed.
    Call it only while holding the directory's lock."""
    directory = Path(directory)
    removed = []
    for folder in (directory, directory / files.FIGURES_DIR):
        if folder.is_symlink() or not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(".") and (p.name.endswith(TMP_SUFFIX) or _OLD_TMP.match(p.name)) and (
                    p.is_symlink() or p.is_file()):
                p.unlink(missing_ok=True)
                removed.append(p)
            elif p.name.startswith(".") and p.name.endswith(TMP_SUFFIX) and p.is_dir() and not p.is_symlink():
                import shutil

                shutil.rmtree(p, ignore_errors=True)  # a folder of write_files
                removed.append(p)
    return removed


def refuse_links(directory: str | Path) -> None:
    """:class:`LinkError` naming the first symbolic link inside ``directory`` (at any depth; links are not
    followed)."""
    for root, dirs, names in os.walk(directory, followlinks=False):
        for name in sorted(dirs + names):
            p = Path(root, name)
            if p.is_symlink():
                raise LinkError(f"{p} is a symbolic link: a run directory holds only the files af1 wrote; remove "
                                f"the link or use a new --out directory")


def safe_name(name: str, what: str) -> str:
    """``name`` if it can be one path component (not empty, not ``.`` or ``..``, no ``/``, ``\\`` or NUL, at
    most 200 bytes), else :class:`~circuits.errors.ArgumentError` naming ``what``."""
    from circuits.errors import ArgumentError

    text = str(name)
    if not text or text in (".", "..") or any(c in text for c in "/\\\0") or len(text.encode()) > 200:
        raise ArgumentError(f"{what} {text!r} cannot name a folder: use a name other than '.' or '..', without "
                            f"'/' or '\\', of at most 200 bytes")
    return text


def inside(root: str | Path, relative: str | Path, what: str) -> Path:
    """``root / relative``, after checking that it stays inside ``root`` (no ``..`` component, not absolute);
    :class:`~circuits.errors.ArgumentError` naming ``what`` otherwise."""
    from circuits.errors import ArgumentError

    rel = Path(relative)
    if rel.is_absolute() or any(part in ("", ".", "..") for part in rel.parts):
        raise ArgumentError(f"{what} {str(relative)!r} would leave {root}: names from data must not hold '..' or "
                            f"start with '/'")
    return Path(root) / rel
