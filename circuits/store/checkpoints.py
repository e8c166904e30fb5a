"""Checkpoint files of a run directory: the partial state of a long computation, replaced whole after each step
so that a killed run resumes from its last step.

A checkpoint is one file written atomically (:func:`circuits.store.atomic.write_bytes`): a header line
(:data:`MAGIC`, then the SHA-256 of the run identity that wrote it, :attr:`circuits.store.runs.RunDir.identity_sha256`)
and the payload. The identity travels inside the file, in the same write, so a killed write leaves the previous
checkpoint whole and a checkpoint of another run (another model, prompts or setting) is never read as this
run's: :func:`read_checkpoint` refuses it, naming the file.
"""

from __future__ import annotations

from pathlib import Path

from circuits.errors import CorruptRunError

__all__ = ["MAGIC", "read_checkpoint", "write_checkpoint"]

MAGIC = b"af1-checkpoint 1 "
"""How a checkpoint file starts (format version 1), before its run identity's hash and a newline."""


def write_checkpoint(path: str | Path, identity_sha256: str, payload: bytes) -> Path:
    """Replace the checkpoint ``path`` by ``payload`` bound to the run identity ``identity_sha256`` (hex),
    atomically."""
    from circuits.store.atomic import write_bytes

    return write_bytes(path, MAGIC + identity_sha256.encode("ascii") + b"\n" + payload)


def read_checkpoint(path: str | Path, identity_sha256: str) -> bytes | None:
    """The payload of checkpoint ``path`` (``None`` if there is none). A file that is not a checkpoint, or one
    another run identity wrote, raises :class:`~circuits.errors.CorruptRunError` naming it."""
    from circuits.store.atomic import no_link

    path = no_link(path)
    if not path.is_file():
        return None
    data = path.read_bytes()
    head, _, payload = data.partition(b"\n")
    if not head.startswith(MAGIC):
        raise CorruptRunError(f"{path} is not an af1 checkpoint: move it away to recompute it, or use a new --out "
                              f"directory")
    theirs = head[len(MAGIC):].decode("ascii", "replace")
    if theirs != identity_sha256:
        raise CorruptRunError(f"{path} was written by another run (run identity hash {theirs[:12]}..., this run's "
                              f"{identity_sha256[:12]}...): resuming it would mix two runs; move it away to "
                              f"recompute it, or use a new --out directory")
    return payload
