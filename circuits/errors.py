"""The project's error hierarchy: every expected failure of a command is one of these (or an error of
the layer below, :mod:`interventions.errors`), and the command line turns each into one line on stderr
and exit code 2 (:func:`describe`, used by :mod:`circuits.cli` and the sweep's failed cells); anything else
is a bug (exit code 1).

Every class keeps the builtin base that callers caught before it existed (``ValueError``,
``FileExistsError``), so ``except ValueError`` around the Python API keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence


class AF1Error(Exception):
    """Base class of the expected failures of the toolkit (bad input, unusable output directory)."""


class ArgumentError(AF1Error, ValueError):
    """An argument (command-line flag or keyword argument) is invalid; the message names the value and
    the valid range."""


class RunDirError(AF1Error, FileExistsError):
    """The output directory cannot be used for this command."""


class RunMismatchError(RunDirError):
    """The output directory holds results of a different command or configuration."""


class RunLockedError(RunDirError):
    """Another process holds the output directory's lock."""


class CorruptRunError(AF1Error, ValueError):
    """A file in an output directory does not have the expected content (wrong schema, out-of-range
    values, a changed artifact); the message names the file, the line and the field."""


class ModelLoadError(AF1Error, ValueError):
    """A model cannot be loaded: an unknown name, missing weights or a missing optional package, or an
    architecture the chosen backend cannot build; the message says what to install or which backend to
    use."""


class PromptError(AF1Error, ValueError):
    """Not enough usable prompts (the model answers too few, or the task has too few)."""


class FitSetError(AF1Error, ValueError):
    """The means cannot be fitted as the analysis needs: no fit set, a scored prompt inside it, or a
    ``(position, token)`` entry with fewer fit prompts than the minimum; the message says how to fix it."""


class EnvironmentMismatchError(AF1Error, RuntimeError):
    """The installed packages cannot do what was asked (training needs ``HookedTransformer``, which
    TransformerLens 4.x removed); the message names the environment that can."""


class Terminated(KeyboardInterrupt):
    """SIGTERM received while a command runs (:func:`circuits.cli.sigterm_as_interrupt`): raised where the command
    is, and handled as Ctrl-C is (the lock released, the one "interrupted" line, exit code 2)."""


MAX_MESSAGE = 400
"""Longest error message printed (characters); longer ones (e.g. a loader's list of every model name) are cut."""


def describe(err: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit code 2)`` for an expected failure, ``None`` for anything else (a bug: the
    command line prints it as an internal error with exit code 1 and a pointer to ``--debug``).

    Expected: the project's errors (:class:`AF1Error`, and :mod:`interventions.errors` of the layer below),
    OS errors (permission, missing file, not a directory, disk full), a malformed JSON file, a corrupt
    safetensors file, a failed remote (NDIF) request, running out of device memory and Ctrl-C (and SIGTERM,
    :class:`Terminated`, a ``KeyboardInterrupt``). A bare
    ``ValueError``, ``TypeError`` or ``KeyError`` is not: user mistakes raise the project's errors.
    """
    import json

    from interventions.errors import InterventionError, InterventionNotAppliedError

    if isinstance(err, (AF1Error, InterventionError, InterventionNotAppliedError)):
        return one_line(err), 2
    if isinstance(err, KeyboardInterrupt):
        return "interrupted; finished results are saved: run the same command again to resume", 2
    if isinstance(err, json.JSONDecodeError):
        return f"a JSON file is malformed ({err}); move it away or use a new --out directory", 2
    if isinstance(err, OSError):
        return one_line(err), 2
    name = type(err).__name__
    if name == "SafetensorError":  # safetensors (not imported here)
        return f"a .safetensors file is corrupt or truncated ({err}); move it away or use a new --out directory", 2
    if name == "RemoteError":  # nnsight: the NDIF job failed (not imported here)
        return (f"the remote (NDIF) request failed: {one_line(err)}; finished results are saved: run the same "
                f"command again to resume"), 2
    if name == "OutOfMemoryError":  # torch.cuda.OutOfMemoryError (torch is not imported here)
        return ("out of device memory: lower --batch-size, use --batch-size auto (halves it and retries) or a "
                "smaller --dtype"), 2
    return None


def one_line(err: BaseException, limit: int = MAX_MESSAGE) -> str:
    """``err``'s message on one line of at most ``limit`` characters (an OS error names its file)."""
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename is not None and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def internal_error(err: BaseException) -> str:
    """The one line of an unexpected failure (a bug): its type and message, and the ``--debug`` pointer."""
    return f"internal error: {type(err).__name__}: {one_line(err)} (run with --debug for the traceback)"


def error_line(err: BaseException) -> str:
    """The one line the command line prints for ``err``: :func:`describe`'s message, else
    :func:`internal_error`."""
    known = describe(err)
    return known[0] if known is not None else internal_error(err)


def close_names(name: str, names: Sequence[str], cutoff: float = 0.6) -> list[str]:
    """The ``names`` closest to ``name`` (``difflib``), best first, at most three."""
    import difflib

    return difflib.get_close_matches(name, list(names), n=3, cutoff=cutoff)


def did_you_mean(name: str, names: Sequence[str], cutoff: float = 0.6) -> str:
    """``"did you mean 'search'? "`` (or ``'a' or 'b'``) for the ``names`` close to a mistyped ``name``; ``""`` when
    none is close. The one hint for mistyped model, task and command names."""
    guess = close_names(name, names, cutoff)
    return f"did you mean {' or '.join(repr(g) for g in guess)}? " if guess else ""
