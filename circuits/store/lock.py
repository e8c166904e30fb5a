"""An exclusive, crash-safe lock on a run directory.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the directory itself, so the kernel releases it when the
holding process exits in any way (``kill -9`` included): a lock can never go stale. While it is held,
``<dir>/.lock`` names the holder's process id (for the refusal message); the file is removed on
release, and a ``.lock`` file left by a killed process is simply overwritten by the next holder.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from circuits.errors import RunLockedError
from circuits.store import files


class DirLock:
    """``with DirLock(path):`` holds the exclusive lock of directory ``path`` (which must exist).

    Raises :class:`~circuits.errors.RunLockedError`, naming the holder's process id, at once when
    another process holds it. Re-entrant within one process is *not* supported: a second ``DirLock``
    on the same directory in the same process is refused like any other holder.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> DirLock:
        fd = os.open(str(self.path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"output directory {self.path} is in use by another af1 command (process {self.holder()}); "
                f"wait for it to finish or use another --out directory"
            ) from None
        self.fd = fd
        try:
            from circuits.store.atomic import write_text

            write_text(self.path / files.LOCK, f"{os.getpid()}\n")
        except BaseException:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            self.fd = None
            raise
        return self

    def holder(self) -> str:
        """The process id recorded in ``.lock`` (``"unknown"`` if it cannot be read)."""
        try:
            return (self.path / files.LOCK).read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            (self.path / files.LOCK).unlink(missing_ok=True)
        except OSError:  # e.g. the file system turned read-only: the flock below is what holds the directory
            pass
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
