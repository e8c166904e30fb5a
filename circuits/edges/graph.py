"""The position-aware edge graph: its nodes, its edges, their names and the memory it takes.

Senders (``n_senders = 1 + n_layers * (n_heads + 1)``, in this order): ``embed``, then per block ``l`` its
query heads ``L{l}H{h}`` and its MLP ``mlp{l}``; each at every prompt position. Receivers: per block the
query input of every query head (``q``), the key and value inputs of every **key/value head** (``k``, ``v``:
``L{l}KV{g}`` where grouped-query attention shares it, else ``L{l}H{g}``), the MLP input (``mlp``), and the
logits (``logits``) at the answer positions.

An edge ``(src, src_pos) -> (dst, dst_pos)`` through ``q``, ``mlp`` or ``logits`` has ``src_pos == dst_pos``;
through ``k`` or ``v`` it says that the head at query position ``dst_pos`` reads position ``src_pos <=
dst_pos``. A sender feeds a receiver when it is upstream: every sender of earlier blocks (and the embedding)
feeds block ``l``'s attention; the MLP of block ``l`` also reads block ``l``'s heads unless attention and MLP
run in parallel; the logits read every sender.

Scores and circuits are kept per receiver as dense tensors (:data:`Slot` keys ``(input, layer)``, ``layer =
n_layers`` for the logits): ``q`` ``[n_up, pos, n_heads]``, ``k``/``v`` ``[n_up, src_pos, n_kv_heads,
dst_pos]``, ``mlp``/``logits`` ``[n_up, pos]``; ``n_up`` counts the upstream senders (a prefix of the sender
order). With ``positional=False`` the position axes have length 1 (scores summed over positions).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Bool, Float

Slot = tuple[str, int]
"""A receiver group: ``(input, layer)`` with input ``q``/``k``/``v``/``mlp``, or ``("logits", n_layers)``."""

Scores = dict[Slot, torch.Tensor]
"""Per-receiver-group tensors (scores, or removal weights of a circuit), shapes as the module docstring says."""

BYTES_PER_EDGE_ROW = 40
"""Bytes per edge of the flat edge table (five int32/float columns and the score as float64, with pandas'
overhead rounded up)."""


@dataclass(frozen=True)
class Layout:
    """Shapes of an edge graph: ``n_pos`` prompt positions (one layout), ``n_answer`` answer positions (the
    last ones), position-resolved or aggregated over positions (``positional``)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    n_pos: int
    n_answer: int = 1
    parallel: bool = False
    positional: bool = True

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def grouped(self) -> bool:
        return self.n_kv_heads != self.n_heads

    @property
    def span(self) -> int:
        """Length of the position axes of the tensors: ``n_pos``, or 1 aggregated over positions."""
        return self.n_pos if self.positional else 1

    def n_up(self, kind: str, layer: int) -> int:
        """How many senders (a prefix of the sender order) feed receiver group ``(kind, layer)``."""
        if kind == "logits":
            return self.n_senders
        base = 1 + layer * (self.n_heads + 1)
        if kind == "mlp" and not self.parallel:
            return base + self.n_heads
        return base

    def slots(self) -> Iterator[Slot]:
        """Every receiver group, in forward order."""
        for layer in range(self.n_layers):
            for kind in ("q", "k", "v", "mlp"):
                yield kind, layer
        yield "logits", self.n_layers

    def shape(self, slot: Slot) -> tuple[int, ...]:
        """Shape of the dense tensor of receiver group ``slot``."""
        kind, layer = slot
        n, t = self.n_up(kind, layer), self.span
        if kind == "q":
            return (n, t, self.n_heads)
        if kind in ("k", "v"):
            return (n, t, self.n_kv_heads, t)
        return (n, t)

    def valid(self, slot: Slot) -> Bool[torch.Tensor, "*shape"]:
        """Which entries of ``slot``'s tensor are edges: ``src_pos <= dst_pos`` for keys and values, the answer
        positions for the logits (every entry where positions are aggregated)."""
        kind, _ = slot
        shape = self.shape(slot)
        mask = torch.ones(shape, dtype=torch.bool)
        if not self.positional:
            return mask
        t = self.n_pos
        if kind in ("k", "v"):
            causal = torch.ones(t, t, dtype=torch.bool).tril().T  # [src_pos, dst_pos]: src <= dst
            mask &= causal[None, :, None, :]
        elif kind == "logits":
            mask[:, : t - self.n_answer] = False
        return mask

    def n_edges(self) -> int:
        """How many edges the graph has (counted from the shapes: the entries :meth:`valid` marks)."""
        return sum(self.slot_edges(s) for s in self.slots())

    def slot_edges(self, slot: Slot) -> int:
        """How many edges receiver group ``slot`` has: every entry of its tensor but, position-resolved, the key
        and value entries with ``src_pos > dst_pos`` and the logits' entries before the answer positions."""
        kind, layer = slot
        n, t = self.n_up(kind, layer), self.n_pos
        if not self.positional:
            return int(np.prod(self.shape(slot)))
        if kind in ("k", "v"):
            return n * self.n_kv_heads * t * (t + 1) // 2
        if kind == "logits":
            return n * min(self.n_answer, t)
        return int(np.prod(self.shape(slot)))

    def memory_bytes(self, batch: int = 1) -> int:
        """Bytes the scores need (float32 per edge, twice: running sums and the table) and one pass over
        ``batch`` prompts holds of the graph (sender outputs and receiver gradients, float32), before any
        model activation."""
        t = self.n_pos
        copies = t if self.positional else 1
        senders = batch * self.n_senders * t * self.d_model
        receivers = batch * self.n_layers * copies * t * (self.n_heads + 2 * self.n_kv_heads + 1) * self.d_model
        return 4 * (2 * self.n_edges() + 2 * senders + receivers) + BYTES_PER_EDGE_ROW * self.n_edges()

    # --- names ---------------------------------------------------------------------------------
    def sender_name(self, index: int) -> str:
        """The name of sender ``index``: ``embed``, ``L{l}H{h}`` or ``mlp{l}``."""
        if index == 0:
            return "embed"
        layer, rest = divmod(index - 1, self.n_heads + 1)
        return f"mlp{layer}" if rest == self.n_heads else f"L{layer}H{rest}"

    def sender_names(self) -> list[str]:
        return [self.sender_name(i) for i in range(self.n_senders)]

    def sender_layer(self, index: int) -> int:
        """The block of sender ``index`` (-1 for the embedding)."""
        return -1 if index == 0 else (index - 1) // (self.n_heads + 1)

    def receiver_name(self, kind: str, layer: int, unit: int = 0) -> str:
        """The name of a receiver: ``L{l}H{h}`` (query), ``L{l}KV{g}`` (key/value head, grouped) or ``L{l}H{g}``,
        ``mlp{l}``, ``logits``."""
        if kind == "q" or (kind in ("k", "v") and not self.grouped):
            return f"L{layer}H{unit}"
        if kind in ("k", "v"):
            return f"L{layer}KV{unit}"
        return "logits" if kind == "logits" else f"mlp{layer}"

    def edge_table(self, scores: Scores) -> dict[str, np.ndarray]:
        """One row per edge of ``scores`` (a full :data:`Scores`): columns ``src`` (sender index), ``src_pos``,
        ``dst`` (receiver index into :meth:`receiver_names`), ``dst_pos``, ``input`` (index into ``INPUTS``),
        ``score``; positions are -1 where aggregated."""
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("src", "src_pos", "dst", "dst_pos", "input", "score")}
        offsets = self.receiver_offsets()
        for slot in self.slots():
            kind, layer = slot
            tensor = scores[slot].detach().double().cpu()
            idx = self.valid(slot).nonzero()
            vals = tensor[self.valid(slot)].numpy()
            src = idx[:, 0].numpy()
            if kind == "q":
                src_pos, unit, dst_pos = idx[:, 1], idx[:, 2], idx[:, 1]
            elif kind in ("k", "v"):
                src_pos, unit, dst_pos = idx[:, 1], idx[:, 2], idx[:, 3]
            else:
                src_pos, unit, dst_pos = idx[:, 1], torch.zeros_like(idx[:, 1]), idx[:, 1]
            dst = offsets[slot] + unit.numpy()
            cols["src"].append(src)
            cols["src_pos"].append(src_pos.numpy() if self.positional else np.full(len(src), -1))
            cols["dst"].append(dst)
            cols["dst_pos"].append(dst_pos.numpy() if self.positional else np.full(len(src), -1))
            cols["input"].append(np.full(len(src), INPUT_KINDS.index(kind)))
            cols["score"].append(vals)
        return {k: np.concatenate(v).astype(np.float64 if k == "score" else np.int32) for k, v in cols.items()}

    def receiver_offsets(self) -> dict[Slot, int]:
        """Index of each receiver group's first receiver in :meth:`receiver_names`."""
        out, n = {}, 0
        for slot in self.slots():
            out[slot] = n
            n += self.units(slot[0])
        return out

    def units(self, kind: str) -> int:
        """Receivers per group: query heads, key/value heads, or one."""
        return self.n_heads if kind == "q" else self.n_kv_heads if kind in ("k", "v") else 1

    def receiver_names(self) -> list[str]:
        return [self.receiver_name(kind, layer, u) for kind, layer in self.slots() for u in range(self.units(kind))]

    def from_table(self, index: np.ndarray, values: np.ndarray, fill: float = 0.0) -> Scores:
        """Dense tensors holding ``values`` at the edges ``index`` (row numbers of :meth:`edge_table`) and
        ``fill`` elsewhere."""
        out: Scores = {}
        start = 0
        row_values = np.full(self.n_edges(), fill, dtype=np.float64)
        row_values[index] = values
        for slot in self.slots():
            valid = self.valid(slot)
            n = int(valid.sum())
            t = torch.full(self.shape(slot), fill, dtype=torch.float32)
            t[valid] = torch.from_numpy(row_values[start : start + n]).float()
            out[slot] = t
            start += n
        return out


INPUT_KINDS = ("q", "k", "v", "mlp", "logits")
"""The ``input`` column's values."""


def zeros(layout: Layout) -> Scores:
    """A :data:`Scores` of zeros."""
    return {slot: torch.zeros(layout.shape(slot)) for slot in layout.slots()}


def total(scores: Scores) -> Float[torch.Tensor, ""]:
    """Sum of every entry (for checks: EAP summed over a receiver's edges is its node attribution)."""
    return torch.stack([t.sum() for t in scores.values()]).sum()
