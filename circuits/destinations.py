"""Where a run's results go: an output directory held for one command (:class:`Run`: created, locked, a directory of
another command refused at once) and, while the run lasts, a :class:`Directory` (``run.json`` checked or written,
the means and prepared prompts kept, records appended, outputs written) or, without one, :class:`Memory` (nothing
written). The runner (:mod:`circuits.runner`) uses them; a sweep and ``af1 groundtruth`` hold their directories
with :class:`Run` too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool

import interventions as iv
from circuits.analyses import Analysis, C, Checkpoints, DirStore, MemoryStore, NoCheckpoints, R, ResultStore, RunContext
from circuits.errors import ArgumentError, CorruptRunError, RunMismatchError
from circuits.means import check_current, keep_means
from circuits.prompts.prepared import Prepared, keep_prepared
from circuits.store import files
from circuits.store.atomic import clean_temporaries, refuse_links
from circuits.store.checkpoints import read_checkpoint, write_checkpoint
from circuits.store.lock import DirLock
from circuits.store.runs import RunDir, read_json_object
from interventions.types import JsonDict, JsonMapping

if TYPE_CHECKING:
    from circuits.store.records import RecordSchema

__all__ = ["LABELS", "DirCheckpoints", "Directory", "Memory", "Run", "command_of", "destination", "hold"]

LABELS = ("model", "task", "source", "numbers", "format")
"""The caller's names of the model and the prompts (``meta``): the model's signature and fingerprint and the
prompts' hash already determine the results, so they are compared only when both identities hold them."""


def command_of(identity: JsonMapping) -> str:
    """Which command wrote a ``run.json`` (identities of the first releases carry no ``analysis`` key:
    prune's has ``command: "prune"``, the search's neither)."""
    if isinstance(identity.get("analysis"), str):
        return identity["analysis"]
    if identity.get("command") == "prune":
        return "prune"
    return "search"


class Run:
    """An output directory held for one command: ``with Run(out, "search") as run:`` creates the directory
    if needed, takes its lock, and refuses at once a directory that holds another command's results (so
    a model is not loaded in vain). On exit the lock is released; a directory this run created and left
    empty is removed again."""

    def __init__(self, out: str | Path, command: str):
        if not str(out).strip():
            raise ArgumentError("--out must be a non-empty path")
        self.path = Path(out)
        self.command = command
        self.created = False
        self.lock: DirLock | None = None

    def __enter__(self) -> Run:
        if self.path.exists() and not self.path.is_dir():
            raise RunMismatchError(f"--out {self.path} exists and is not a directory; choose a directory")
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = DirLock(self.path).acquire()
        try:
            refuse_links(self.path)
            clean_temporaries(self.path)
            ident = self.path / files.IDENTITY
            if ident.exists():
                try:
                    theirs = command_of(read_json_object(ident))
                except CorruptRunError as err:
                    raise RunMismatchError(str(err)) from None
                if theirs != self.command:
                    raise RunMismatchError(
                        f"output directory {self.path} holds results of a different command (`af1 {theirs}`, not "
                        f"`af1 {self.command}`); "
                        f"use a new --out directory"
                    )
            elif any(p.name in files.RESULT_FILES for p in self.path.iterdir()):
                raise RunMismatchError(
                    f"{self.path} holds af1 results but no {files.IDENTITY}: cannot tell which command wrote them; "
                    f"use a new --out directory"
                )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None
        if self.created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()


@contextlib.contextmanager
def hold(out: str | Path | None, command: str, held: Run | None = None) -> Iterator[Run | None]:
    """The :class:`Run` of ``out`` for ``command``: ``held`` when the caller already holds it, else taken here
    (and released on exit); ``None`` without an output directory."""
    if out is None or held is not None:
        yield None if out is None else held
        return
    with Run(out, command) as run:
        yield run


class Memory:
    """Where a run without an output directory keeps things: its records in memory, nothing written."""

    run_dir: RunDir | None = None

    def open(self, analysis: Analysis[C, R], identity: Callable[[], JsonDict]) -> None:
        """Nothing to check (the identity is not even built)."""

    def store(self, schema: Callable[[], RecordSchema | None]) -> ResultStore:
        return MemoryStore()

    def checkpoints(self) -> Checkpoints:
        """Nothing kept between batches."""
        return NoCheckpoints()

    def keep_means(self, cache: iv.MeanCache) -> None:
        """Nothing to keep."""

    def keep_prepared(self, prepared: Prepared, keep: Bool[torch.Tensor, " n"]) -> None:
        """Nothing to keep."""

    def write_prompts(self, records: list[JsonDict] | None) -> None:
        """Nothing to write."""

    def write(self, analysis: Analysis[C, R], result: R, ctx: RunContext) -> None:
        """Nothing to write."""


class Directory(Memory):
    """A run directory: ``run.json`` checked or written, the means and the prepared prompts kept, records
    appended to the analysis's results file, the outputs written (:mod:`circuits.store.runs`)."""

    def __init__(self, path: Path):
        self.path = path
        self.results_file: str | None = None

    def open(self, analysis: Analysis[C, R], identity: Callable[[], JsonDict]) -> None:
        """Refuse a directory of an earlier version's means, then check ``run.json`` against ``identity()`` (or
        write it)."""
        check_current(self.path)
        self.results_file = analysis.results_file
        self.run_dir = RunDir(self.path, identity(), results_name=analysis.results_file or files.NO_RESULTS,
                              optional=LABELS + analysis.optional_identity).open()

    def store(self, schema: Callable[[], RecordSchema | None]) -> ResultStore:
        assert self.run_dir is not None
        return DirStore(self.run_dir, schema()) if self.results_file is not None else MemoryStore()

    def checkpoints(self) -> Checkpoints:
        """The run directory's checkpoint files, bound to the run's identity."""
        assert self.run_dir is not None
        return DirCheckpoints(self.run_dir)

    def keep_means(self, cache: iv.MeanCache) -> None:
        assert self.run_dir is not None
        keep_means(self.run_dir, cache)

    def keep_prepared(self, prepared: Prepared, keep: Bool[torch.Tensor, " n"]) -> None:
        assert self.run_dir is not None
        keep_prepared(self.run_dir, prepared, keep)

    def write_prompts(self, records: list[JsonDict] | None) -> None:
        if records is not None:
            assert self.run_dir is not None
            self.run_dir.write_jsonl(files.PROMPTS, records)

    def write(self, analysis: Analysis[C, R], result: R, ctx: RunContext) -> None:
        assert self.run_dir is not None
        analysis.write(result, self.run_dir, ctx)


class DirCheckpoints:
    """:class:`~circuits.analyses.Checkpoints` as files of a run directory (``name`` is the file's), each written
    atomically with the run identity's hash inside (:mod:`circuits.store.checkpoints`): another run's is refused."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir

    def load(self, name: str) -> bytes | None:
        return read_checkpoint(self.run_dir.path / name, self.run_dir.identity_sha256)

    def keep(self, name: str, data: bytes) -> None:
        write_checkpoint(self.run_dir.path / name, self.run_dir.identity_sha256, data)


@contextlib.contextmanager
def destination(out_dir: str | Path | None, command: str, held: Run | None = None) -> Iterator[Memory]:
    """Where a run's results go: a :class:`Directory` (held for ``command`` while the run lasts, see
    :func:`hold`) or, without ``out_dir``, :class:`Memory`."""
    with hold(out_dir, command, held) as run:
        yield Memory() if run is None else Directory(run.path)
