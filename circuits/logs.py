"""The package's messages go through :mod:`logging`, under the ``circuits`` logger (progress bars stay tqdm).

``logging.getLogger("circuits")`` (or a child, ``circuits.lens``) is where the library reports what it skips,
resumes or converts; the ``af1`` command line shows them on stderr (:func:`cli_handler`), a notebook shows
them once logging is configured (``logging.basicConfig(level=logging.INFO)``). TransformerLens's
"Moving model to device" lines are not printed: models are moved with :func:`quiet_to`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["LOGGER", "cli_handler", "get_logger", "quiet_to"]

LOGGER = "circuits"


def get_logger(name: str | None = None) -> logging.Logger:
    """``circuits`` or its child ``circuits.<name>`` (``name`` may already start with ``circuits``)."""
    if not name or name == LOGGER:
        return logging.getLogger(LOGGER)
    return logging.getLogger(name if name.startswith(LOGGER + ".") else f"{LOGGER}.{name}")


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a message comes (not when it was made)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def cli_handler(level: int = logging.INFO) -> None:
    """Show the package's messages on stderr as ``af1: message`` (once; the command line calls it)."""
    root = logging.getLogger(LOGGER)
    if any(getattr(h, "_af1", False) for h in root.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("af1: %(message)s"))
    handler._af1 = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


def quiet_to(model: Any, device_or_dtype: Any) -> Any:
    """``model.to(device_or_dtype)`` without TransformerLens's "Moving model to device" line."""
    try:
        return model.to(device_or_dtype, print_details=False)
    except TypeError:  # a model whose .to takes no print_details (a TransformerBridge, a torch module)
        return model.to(device_or_dtype)
