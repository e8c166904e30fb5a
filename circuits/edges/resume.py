"""What a killed ``af1 edges`` run leaves for the same command to resume: the senders' mean outputs over the fit set
(``--counterfactual cama``/``mean``, kept as a checkpoint once computed: :data:`MEANS`, the payload of
:meth:`circuits.edges.scores.MeanOutputs.to_bytes`), the score sums of the batches done (:class:`Partial`, kept as a
checkpoint: :data:`SUMS`) and the metric per prompt of each circuit of the faithfulness curve already evaluated
(one line of :data:`CURVE` per circuit).

The sums are float32, kept exactly (safetensors) and added to in the same order, so a resumed run with the same
batch size gives the scores of an uninterrupted one, bit for bit; with another batch size (``--batch-size auto``
halving after an out-of-memory error) it goes on from the prompts done, in batches of the new size. The metrics of
a circuit are float32 values, exact through JSON; a circuit is named by its size and a hash of its edges
(:func:`circuit_key`), so a line is reused only for the very circuit it measured. The means are float32 too, read
back exactly, so a resumed run's counterfactual is the uninterrupted run's, bit for bit.

All three are bound to the run's identity (the checkpoint carries its hash; the curve's lines are the run's results
file, under its ``run.json``) and kept when the run finishes: the same command again then recomputes nothing and
rewrites the same outputs.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from circuits.edges.graph import Layout, Scores
from circuits.errors import CorruptRunError
from circuits.store import files
from circuits.store.records import Field, RecordSchema

if TYPE_CHECKING:
    from circuits.edges.config import EdgesConfig
    from interventions.adapter import ModelInfo
    from interventions.types import JsonMapping

__all__ = ["CURVE", "MEANS", "SUMS", "KEEP_RATIO", "Keeper", "Partial", "circuit_key", "curve_schema", "known_circuits",
           "payload_metadata"]

SUMS = files.EDGES_PARTIAL
"""The checkpoint of the score sums."""
MEANS = files.EDGES_MEANS
"""The checkpoint of the fit set's mean outputs."""
CURVE = files.EDGES_CURVE
"""The curve's results file: one line per evaluated circuit."""
KEEP_RATIO = 9.0
"""The sums are kept after a batch once the batches since the last keep took this many times as long as writing
it did (writing then costs at most a tenth of the run), and always after the first batch and the last."""


def slot_name(slot: tuple[str, int]) -> str:
    """The tensor name of receiver group ``slot`` in the checkpoint: ``sum.q.3``."""
    return f"sum.{slot[0]}.{slot[1]}"


@dataclass
class Partial:
    """The scoring of the first ``done`` prompts: the per-edge score sums (float32, :mod:`circuits.edges.graph`
    shapes), their clean metric (``[done]``, logits) and the batch size they were run in."""

    done: int
    sums: Scores
    clean: torch.Tensor
    batch_size: int

    def to_bytes(self) -> bytes:
        """The checkpoint's payload (safetensors: the sums, the clean metric, ``done`` and ``batch_size``)."""
        from safetensors.torch import save

        tensors = {slot_name(slot): t.contiguous() for slot, t in self.sums.items()}
        tensors["clean"] = self.clean.float().contiguous()
        return save(tensors, metadata={"done": str(self.done), "batch_size": str(self.batch_size)})

    @classmethod
    def from_bytes(cls, data: bytes, layout: Layout, n_prompts: int, where: str = SUMS) -> Partial:
        """The :class:`Partial` of a checkpoint's payload, checked against the run's ``layout`` and its
        ``n_prompts``; :class:`~circuits.errors.CorruptRunError` naming ``where`` when it does not fit."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        fix = "move it away to recompute the scores, or use a new --out directory"
        try:
            tensors = load(data)
            meta = payload_metadata(data)
            done, batch = int(meta["done"]), int(meta["batch_size"])
        except (SafetensorError, ValueError, KeyError) as err:
            raise CorruptRunError(f"{where} is not a checkpoint of af1 edges ({type(err).__name__}): {fix}") from None
        sums = {}
        for slot in layout.slots():
            t = tensors.get(slot_name(slot))
            if t is None or tuple(t.shape) != layout.shape(slot) or t.dtype != torch.float32:
                raise CorruptRunError(f"{where}: the sums of {slot_name(slot)} do not fit the run's graph; {fix}")
            sums[slot] = t
        clean = tensors.get("clean")
        if not 0 < done <= n_prompts or batch < 1 or clean is None or tuple(clean.shape) != (done,):
            raise CorruptRunError(f"{where}: {done} prompts done of {n_prompts} do not fit the run; {fix}")
        return cls(done=done, sums=sums, clean=clean, batch_size=batch)


def payload_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors payload (``{}`` without). A payload whose header is not JSON raises
    ``ValueError``."""
    import json

    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    return dict(header.get("__metadata__") or {})


class Keeper:
    """``keeper(partial)`` after each batch: hands ``partial``'s bytes to ``keep`` (a
    :meth:`~circuits.analyses.Checkpoints.keep` of :data:`SUMS`) after the first batch, the last (``partial.done
    == total``) and whenever the batches since the last keep took :data:`KEEP_RATIO` times as long as that
    keep's write. ``clock``: seconds (monotonic)."""

    def __init__(self, keep: Callable[[bytes], None], total: int,
                 clock: Callable[[], float] = time.monotonic):
        self.keep, self.total, self.clock = keep, total, clock
        self.written: float | None = None  # seconds the last keep took (None: none yet)
        self.since = clock()

    def __call__(self, partial: Partial) -> None:
        now = self.clock()
        if self.written is not None and partial.done < self.total and now - self.since < KEEP_RATIO * self.written:
            return
        self.keep(partial.to_bytes())
        self.since = self.clock()
        self.written = self.since - now


def circuit_key(kept: np.ndarray | None) -> str:
    """The name of a circuit of the curve: ``empty``, or its number of edges and the first 16 hex digits of the
    SHA-256 of its edges' row numbers (int64)."""
    if kept is None:
        return "empty"
    rows = np.ascontiguousarray(np.asarray(kept, dtype=np.int64))
    return f"{len(rows)}:{hashlib.sha256(rows.tobytes()).hexdigest()[:16]}"


def curve_schema(config: EdgesConfig, info: ModelInfo, n_prompts: int) -> RecordSchema:
    """The schema of a line of :data:`CURVE`: ``circuit`` (:func:`circuit_key`) and ``metric`` (one number, or
    ``null`` for a non-finite one, per prompt)."""

    def check(record: JsonMapping) -> tuple[str, str] | None:
        metric = record["metric"]
        if len(metric) != n_prompts:
            return "metric", f"holds {len(metric)} values for {n_prompts} prompts"
        if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in metric):
            return "metric", "must hold numbers"
        return None

    return RecordSchema(fields=(Field("circuit", "str"), Field("metric", "list")), key=("circuit",), check=check)


def known_circuits(records: Sequence[JsonMapping]) -> dict[str, np.ndarray]:
    """The metric per prompt (float32) of each circuit of the curve's lines, by :func:`circuit_key`."""
    return {str(r["circuit"]): np.asarray([math.nan if v is None else v for v in r["metric"]], dtype=np.float32)
            for r in records}
