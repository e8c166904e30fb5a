"""Edge scores in MIB's circuit-track submission format (the EAP-IG library's ``Graph.to_json``).

The format is position-free and names attention inputs per query head: ``{"cfg": {n_layers, n_heads,
parallel_attn_mlp, d_model}, "nodes": {name: {"in_graph": bool}}, "edges": {name: {"score": float, "in_graph":
bool}}}`` with nodes ``input``, ``a{l}.h{h}``, ``m{l}``, ``logits`` and edges ``{parent}->{child}`` (into an MLP or
the logits) or ``{parent}->a{l}.h{h}<q|k|v>``. Our position-aware scores are summed over positions. A key or
value edge of a grouped-query model ends at a key/value head; MIB has one edge per query head, so the key/value
head's score is shared equally by its query heads (the sum over them is the score, nothing is counted twice).
An edge is ``in_graph`` when it is among the ``n_edges`` candidate edges of largest ``|score|`` (default: every
candidate edge); MIB's evaluation ranks the scores itself.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from circuits.edges.graph import INPUT_KINDS

if TYPE_CHECKING:
    from interventions.types import JsonDict, JsonMapping

__all__ = ["mib_name", "to_mib", "write_mib"]


def mib_name(name: str) -> str:
    """Our node name as MIB's: ``embed`` -> ``input``, ``L3H1`` -> ``a3.h1``, ``mlp3`` -> ``m3``."""
    if name == "embed":
        return "input"
    if name.startswith("mlp"):
        return "m" + name[3:]
    if name == "logits":
        return name
    layer, head = name[1:].split("H")
    return f"a{layer}.h{head}"


def to_mib(result: Any, n_edges: int | None = None) -> JsonDict:
    """The MIB document of an :class:`~circuits.edges.result.EdgesResult` (see the module docstring)."""
    lay, t = result.layout, result.table
    group = lay.n_heads // lay.n_kv_heads
    scores: dict[str, float] = defaultdict(float)
    cand: dict[str, bool] = defaultdict(bool)
    for src, dst, kind, score, ok in zip(t["src"], t["dst"], t["input"], t["score"], t["candidate"]):
        parent = mib_name(result.senders[src])
        what = INPUT_KINDS[kind]
        receiver = result.receivers[dst]
        if what == "q":
            children = [(mib_name(receiver), "<q>")]
        elif what in ("k", "v"):
            layer, unit = receiver[1:].replace("KV", "H").split("H")
            heads = range(int(unit) * group, (int(unit) + 1) * group) if lay.grouped else [int(unit)]
            children = [(f"a{layer}.h{h}", f"<{what}>") for h in heads]
        else:
            children = [(mib_name(receiver), "")]
        share = float(score) / len(children)
        for child, tag in children:
            name = f"{parent}->{child}{tag}"
            scores[name] += share
            cand[name] |= bool(ok)
    names = [n for n in scores if cand[n]]
    order = sorted(names, key=lambda n: -abs(scores[n]))
    keep = set(order if n_edges is None else order[:n_edges])
    nodes: dict[str, dict[str, bool]] = {"input": {"in_graph": False}}
    for layer in range(lay.n_layers):
        nodes.update({f"a{layer}.h{h}": {"in_graph": False} for h in range(lay.n_heads)})
        nodes[f"m{layer}"] = {"in_graph": False}
    nodes["logits"] = {"in_graph": True}
    for name in keep:
        parent, child = name.split("->")
        nodes[parent]["in_graph"] = True
        nodes[child.split("<")[0]]["in_graph"] = True
    return {
        "cfg": {"n_layers": lay.n_layers, "n_heads": lay.n_heads, "parallel_attn_mlp": lay.parallel,
                "d_model": lay.d_model},
        "nodes": nodes,
        "edges": {n: {"score": float(np.float64(scores[n])), "in_graph": n in keep} for n in scores},
    }


def write_mib(path: str | Path, doc: JsonMapping) -> Path:
    """Write ``doc`` as JSON to ``path`` (atomically: a reader never sees half a file)."""
    from circuits.store.atomic import write_text

    return write_text(path, json.dumps(doc))
