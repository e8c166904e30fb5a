"""The intervention layer's errors (torch-free, so that the command line can recognise them without importing
torch). :mod:`interventions.types` re-exports them; every one keeps the builtin base callers catch."""

from __future__ import annotations


class InterventionError(ValueError):
    """Bad input to an intervention: the message names the bad value and the valid range."""


class CacheMismatchError(InterventionError):
    """A MeanCache does not fit the model or the prompts it is applied to."""


class InterventionNotAppliedError(RuntimeError):
    """An intervention's hook never fired during a forward pass: it would have silently done nothing."""
