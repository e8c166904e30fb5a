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
import time
from collections.abc import Iterator, Sequence
from typing import IO, TYPE_CHECKING, TextIO, TypeVar

if TYPE_CHECKING:
    import torch

    from interventions.types import Model


M = TypeVar("M", bound="Model")

__all__ = ["LOGGER", "Transcript", "cli_handler", "get_logger", "quiet_stdout", "quiet_to"]

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
    def stream(self) -> IO[str]:
        return sys.stderr if self.stderr else sys.stdout

    @stream.setter
    def stream(self, value: object) -> None:
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


def quiet_to(model: M, device_or_dtype: torch.device | torch.dtype | str) -> M:
    """``model.to(device_or_dtype)`` without TransformerLens's "Moving model to device" line."""
    try:
        return model.to(device_or_dtype, print_details=False)
    except TypeError:  # a model whose .to takes no print_details (a TransformerBridge, a torch module)
        return model.to(device_or_dtype)


class _Tee(io.TextIOBase):
    """A text stream writing to each of ``targets`` (none: a sink); ``fileno`` and ``isatty`` are ``base``'s."""

    def __init__(self, base: IO[str], targets: Sequence[IO[str]]) -> None:
        super().__init__()
        self.base, self.targets = base, list(targets)

    def write(self, text: str) -> int:
        for target in self.targets:
            target.write(text)
        return len(text)

    def flush(self) -> None:
        for target in self.targets:
            target.flush()

    def fileno(self) -> int:
        return self.base.fileno()

    def isatty(self) -> bool:
        return self.base in self.targets and self.base.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.base, "encoding", None) or "utf-8")


class Transcript:
    """How a scripted command reports (the command line's ``--quiet`` and ``--log-file``), as a context manager.

    ``quiet``: nothing on stdout (the command's output and the information messages; warnings and errors still go to
    stderr). ``log_file``: everything the command writes on stdout and stderr is appended to that file too (also
    what ``quiet`` hides), between a first line ``# af1 ... (started <UTC time>)`` and a last line ``# exit <code>
    after <seconds> s`` (:meth:`end`). The file is opened (appended to) on entry: an ``OSError`` if it cannot be.
    """

    def __init__(self, command: Sequence[str], quiet: bool = False, log_file: str | None = None) -> None:
        self.command, self.quiet, self.log_file = list(command), quiet, log_file
        self.file: IO[str] | None = None
        self.start = time.perf_counter()
        self.saved: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)

    def __enter__(self) -> Transcript:
        self.saved = (sys.stdout, sys.stderr)
        if not self.quiet and self.log_file is None:
            return self  # the streams as they are
        out, err = self.saved
        logged: list[IO[str]] = []
        if self.log_file is not None:
            self.file = open(self.log_file, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in __exit__
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.file.write(f"# {' '.join(self.command)} (started {stamp})\n")
            logged = [self.file]
        sys.stdout = _Tee(out, ([] if self.quiet else [out]) + logged)
        sys.stderr = _Tee(err, [err, *logged])
        return self

    def end(self, code: int) -> None:
        """Write the last line of the log file: the exit code and the command's wall time."""
        if self.file is not None:
            self.file.write(f"# exit {code} after {time.perf_counter() - self.start:.1f} s\n")

    def __exit__(self, *exc: object) -> None:
        sys.stdout, sys.stderr = self.saved
        if self.file is not None:
            self.file.close()
