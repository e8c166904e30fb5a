"""How a run goes, beside what it analyses (:class:`RunOptions`): where it writes, the batch size, progress bars, the
command line it records, a means cache to reuse. Importable without torch (the command line's ``--out``,
``--batch-size`` and ``--no-progress`` are declared on its fields); the runner (:mod:`circuits.runner`) takes it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.flags import flag

if TYPE_CHECKING:
    from circuits.destinations import Run
    from interventions.cache import MeanCache

__all__ = ["RunOptions", "batch_size_argument"]


def batch_size_argument(text: str) -> int | str:
    """``--batch-size``: a positive integer, or ``auto`` (see :func:`circuits.models.memory.auto_batch_size`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'auto'") from None


@dataclass(frozen=True)
class RunOptions:
    """How a run goes, beside what it analyses.

    ``out``: the run directory (``None``: nothing is written, records are kept in memory); ``batch_size``: prompts
    per forward pass, an integer or ``"auto"`` (``None``: the config's); ``progress``: show bars; ``command``: the
    command line, recorded in ``summary.json``; ``cache``: a means cache to use instead of fitting one (named by its
    hash in the identity), or, with a fit set, the cache already fitted on it (several analyses of one prompt set
    share it); ``min_count``: fit prompts each mean needs (default: the fit set's, else
    :data:`~circuits.prompts.fitset.DEFAULT_MIN_COUNT`); ``on_means``: called with the means cache the run uses;
    ``held``: the :class:`~circuits.destinations.Run` of ``out`` when the caller holds it already (commands take the
    lock before loading the model).
    """

    out: str | Path | None = field(default=None, metadata=flag("output directory (created; re-run to resume)"))
    batch_size: int | str | None = field(default=None, metadata=flag(
        "prompts per forward pass; auto: the largest that fits (on CPU 64), halved and retried when the GPU runs out "
        "of memory", type=batch_size_argument))
    progress: bool = field(default=True, metadata=flag("hide progress bars", name="--no-progress"))
    command: Sequence[str] | None = None
    cache: MeanCache | None = None
    min_count: int | None = None
    on_means: Callable[[MeanCache], None] | None = None
    held: Run | None = None
