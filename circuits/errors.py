"""The project's error hierarchy: every expected failure of a command is one of these (or an error of
the layer below, :mod:`interventions.types`), and the command line turns each into one line on stderr
and exit code 2 (:mod:`circuits.cli`).

Every class keeps the builtin base that callers caught before it existed (``ValueError``,
``FileExistsError``), so ``except ValueError`` around the Python API keeps working.
"""

from __future__ import annotations


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
