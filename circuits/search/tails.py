"""The self-peek tails of one wait's configurations, run together block by block.

After its transfer blocks a configuration ``(wait, transfer)`` runs blocks ``wait + 1 + transfer .. n_layers - 1``
with every token self-peeking, so each answer position depends only on itself and BOS (whose state is the
model's own in every prompt). :class:`WaitTails` holds the answer rows of every configuration of one wait
that has entered its tail, from every prompt batch, and runs each block once over all of them: the rows of
a transfer join when the transfer prefix reaches them, and every tail ends after the last block. The
evaluator (:class:`circuits.search.evaluators.FastEvaluator`) then unembeds the final rows.

Rows per tail kind (``[rows, cols, d_model]``, one group per answer position unless ``"full"``):

* ``"last"``: the answer position alone (``cols = 1``), against BOS's frozen key and value at its true position;
* ``"pair"``: ``[BOS, answer position]`` (``cols = 2``), the answer position at its true position;
* ``"full"``: every position (``cols = n_pos``), every token self-peeking through a mask, one group.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from jaxtyping import Float

import interventions as iv
from interventions.adapter import ModelAdapter

PHASES = ("lookup", "prefix", "tails", "unembed")
"""The phases the fast evaluator times (seconds in ``FastEvaluator.seconds``): the ablated residual by lookup
(or the embedding), the transfer prefix, the self-peek tails, the unembedding and readout."""


class WaitTails:
    """The tails of one wait's configurations (see the module docstring). ``chunk``: prompts per block call
    at full width (a call takes ``chunk * max(1, n_pos // cols)`` rows: about one batch's memory).
    ``seconds``: a dict whose ``"tails"`` entry accumulates the time spent in blocks."""

    def __init__(self, adapter: ModelAdapter, tail: str, n_pos: int, n_answer: int, *, bos_kv: Any, rotary: bool,
                 chunk: int, seconds: dict[str, float]):
        self.adapter, self.tail, self.n_pos, self.k = adapter, tail, n_pos, n_answer
        self.bos_kv, self.rotary, self.seconds = bos_kv, rotary, seconds
        self.answer_pos = list(range(n_pos - n_answer, n_pos))
        self.cols: list[list[int]] = (
            [list(range(n_pos))] if tail == "full" else [[0, p] if tail == "pair" else [p] for p in self.answer_pos])
        self.step = max(1, chunk) * max(1, n_pos // len(self.cols[0]))
        self.rows: list[list[torch.Tensor]] = [[] for _ in self.cols]
        self.segments: list[tuple[int, int]] = []  # (transfer, prompts), in the order of the rows
        self.calls = 0

    def add(self, transfer: int, states: list[Float[torch.Tensor, "batch pos d_model"]]) -> None:
        """The rows of ``states`` (every prompt batch's residual entering block ``wait + 1 + transfer``) join
        the tails as configuration ``transfer``."""
        for rows, cols in zip(self.rows, self.cols):
            rows.extend(x[:, cols] for x in states)
        self.segments.append((transfer, sum(int(x.shape[0]) for x in states)))

    def run_block(self, block: int) -> None:
        """Run block ``block`` (0-indexed) over every row held, every token self-peeking."""
        if not self.segments:
            return
        t0 = time.perf_counter()
        ad = self.adapter
        for g, cols in enumerate(self.cols):
            x = torch.cat(self.rows[g]) if len(self.rows[g]) > 1 else self.rows[g][0]
            outs = []
            for i in range(0, int(x.shape[0]), self.step):
                part = x[i : i + self.step]
                self.calls += 1
                if self.tail == "last":
                    at = cols[0] if self.rotary else 1
                    outs.append(ad.run_last_from(part, block, self.bos_kv, at, stop=block + 1))
                elif self.tail == "pair":
                    # With only BOS and one answer row "self peek" is the ordinary causal row: no mask.
                    positions = torch.tensor(cols) if self.rotary else None
                    outs.append(ad.run_from(part, block, block + 1, positions=positions))
                else:
                    with iv.apply(ad.model, [iv.Peek([block], mode="self", queries="all")], check_fired=True):
                        outs.append(ad.run_from(part, block, block + 1))
            self.rows[g] = [torch.cat(outs) if len(outs) > 1 else outs[0]]
        self.seconds["tails"] += time.perf_counter() - t0

    def final(self) -> dict[int, Float[torch.Tensor, "batch k d_model"]]:
        """Per transfer: the answer positions' residual after the last block, ``[prompts, k, d_model]``."""
        if self.tail == "full":
            x = torch.cat(self.rows[0])[:, -self.k:]
        else:
            x = torch.stack([torch.cat(rows)[:, -1] for rows in self.rows], dim=1)
        out, at = {}, 0
        for transfer, n in self.segments:
            out[transfer] = x[at : at + n]
            at += n
        return out
