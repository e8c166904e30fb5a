"""The package's messages go through :mod:`logging`, under the ``circuits`` logger (progress bars stay tqdm).

``logging.getLogger("circuits")`` (or a child, ``circuits.lens``) is where the library reports what it skips,
resumes or converts; the ``af1`` command line shows them (:func:`cli_handler`: information on stdout, warnings on
stderr), a notebook shows them once logging is configured (``logging.basicConfig(level=logging.INFO)``).
TransformerLens's "Moving model to device" and "Loaded pretrained model" lines are not printed: models are moved with
:func:`quiet_to` and loaded under :func:`quiet_stdout` (the lines go to the logger at DEBUG).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from interventions.types import Model


__all__ = ["LOGGER", "cli_handler", "get_logger", "quiet_stdout", "quiet_to"]

LOGGER = "circuits"


def get_logger(name: str | None = None) -> logging.Logger:
    """``circuits`` or its child ``circuits.<name>`` (``name`` may already start with ``circuits``)."""
    if not name or name == LOGGER:
        return logging.getLogger(LOGGER)
    return logging.getLogger(name if name.startswith(LOGGER + ".") else f"{LOGGER}.{name}")


class _Console(logging.StreamHandler):
    """A handler writing to whatever ``sys.stdout`` (``stderr=False``) or ``sys.stderr`` is when a message comes
    (not when it was made)."""

    def __init__(self, stderr: bool) -> None:
        super().__init__()
        self.stderr = stderr

    @property
    def stream(self) -> Any:
        return sys.stderr if self.stderr else sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def cli_handler(level: int = logging.INFO) -> None:
    """Show the package's messages (once; the command line calls it): information (what a command uses, the
    memory estimate, what it resumes) on stdout beside the command's own output, warnings and errors on stderr
    as ``af1: message``; so a command that fails still says so in one line on stderr."""
    root = logging.getLogger(LOGGER)
    if any(getattr(h, "_af1", False) for h in root.handlers):
        return
    info, problems = _Console(stderr=False), _Console(stderr=True)
    info.setLevel(min(level, logging.INFO))  # --debug: DEBUG records too (a failed sweep cell's traceback)
    info.addFilter(lambda record: record.levelno < logging.WARNING)
    info.setFormatter(logging.Formatter("%(message)s"))
    problems.setLevel(logging.WARNING)
    problems.setFormatter(logging.Formatter("af1: %(message)s"))
    for handler in (info, problems):
        handler._af1 = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


@contextlib.contextmanager
def quiet_stdout(name: str = "loading") -> Iterator[None]:
    """Run a block whose library prints on stdout (TransformerLens 3.x's "Loaded pretrained model ... into
    HookedTransformer", "Moving model to device: ..."): its lines go to the ``circuits.<name>`` logger at DEBUG
    instead."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        log = get_logger(name)
        for line in buf.getvalue().splitlines():
            if line.strip():
                log.debug("%s", line.strip())


def quiet_to(model: Model, device_or_dtype: Any) -> Any:
    """``model.to(device_or_dtype)`` without TransformerLens's "Moving model to device" line."""
    try:
        return model.to(device_or_dtype, print_details=False)
    except TypeError:  # a model whose .to takes no print_details (a TransformerBridge, a torch module)
        return model.to(device_or_dtype)
