"""Edge scores against a planted AF1 structure (the zoo's ground truths): which cross-position edges carry
non-negligible scores, and precision and recall against the planted transfer heads.

A cross-position edge is a key or value edge ``(src, p) -> (head, q)`` with ``p`` neither BOS (0) nor ``q``. An
edge is non-negligible when ``|score| >= rel * max |score|`` over every edge of the graph. The planted edges are
the cross-position edges into the answer positions that end at a planted head's key/value head (``L3KV1`` for
query head ``L3H2`` of a model with two query heads per key/value head)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from circuits.edges.graph import INPUT_KINDS, Layout

__all__ = ["Recovery", "planted_receivers", "recovery"]


def planted_receivers(layout: Layout, heads: Mapping[int, Sequence[int]]) -> set[str]:
    """The key/value receivers of planted query heads ``{layer: [head, ...]}``."""
    group = layout.n_heads // layout.n_kv_heads
    return {layout.receiver_name("k", int(layer), int(h) // group) for layer, hs in heads.items() for h in hs}


@dataclass(frozen=True)
class Recovery:
    """How the scores recover a planted structure. ``found``: receivers with a non-negligible cross-position edge
    into the answer positions; ``head_precision``/``head_recall`` over receivers; ``edge_precision``: share of the
    non-negligible cross-position edges that are planted; ``edge_recall``: share of the planted edges that are
    non-negligible; ``leak``: the largest relative ``|score|`` of a cross-position edge into any other position
    (the structure says none); ``rel``: the threshold."""

    found: list[str]
    planted: list[str]
    head_precision: float
    head_recall: float
    edge_precision: float
    edge_recall: float
    leak: float
    rel: float


def recovery(layout: Layout, receivers: Sequence[str], table: Mapping[str, np.ndarray],
             heads: Mapping[int, Sequence[int]], rel: float = 1e-3) -> Recovery:
    """:class:`Recovery` of the edge ``table`` (:meth:`Layout.edge_table` columns) against planted ``heads``."""
    score = np.abs(np.asarray(table["score"], dtype=float))
    big = score >= rel * score.max()
    kv = np.isin(table["input"], [INPUT_KINDS.index("k"), INPUT_KINDS.index("v")])
    cross = kv & (table["src_pos"] != table["dst_pos"]) & (table["src_pos"] > 0)
    last = table["dst_pos"] >= layout.n_pos - layout.n_answer
    names = np.asarray(receivers)[table["dst"]]
    planted = planted_receivers(layout, heads)
    at_planted = np.isin(names, sorted(planted))
    found = set(names[cross & last & big].tolist())
    hit = found & planted
    n_big = int((cross & big).sum())
    planted_edges = cross & last & at_planted
    return Recovery(
        found=sorted(found), planted=sorted(planted),
        head_precision=len(hit) / len(found) if found else float("nan"),
        head_recall=len(hit) / len(planted) if planted else float("nan"),
        edge_precision=int((cross & big & last & at_planted).sum()) / n_big if n_big else float("nan"),
        edge_recall=(int((planted_edges & big).sum()) / int(planted_edges.sum()) if planted_edges.any()
                     else float("nan")),
        leak=float(score[cross & ~last].max() / score.max()) if (cross & ~last).any() else 0.0, rel=rel)
