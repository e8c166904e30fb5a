"""The result of an edge attribution run (:class:`EdgesResult`): the scored edges, the faithfulness curve, and
its files (``edges.npz``: one row per edge; ``edges.json``: settings, graph shape, curve and top edges)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from circuits.edges.circuit import Curve, CurvePoint
from circuits.edges.graph import INPUT_KINDS, Layout
from circuits.store import files

if TYPE_CHECKING:
    from interventions.types import DataFrame, Figure, JsonDict, JsonMapping

__all__ = ["COLUMNS", "EdgesResult"]

COLUMNS = ("src", "src_pos", "dst", "dst_pos", "input", "score", "candidate")
"""The arrays of ``edges.npz`` (``src``/``dst``/``input`` as indices into the name lists of ``edges.json``)."""
EDGES_ARRAYS = files.EDGES_ARRAYS
EDGES_JSON = files.EDGES


@dataclass
class EdgesResult:
    """Scored edges of one model on one prompt layout.

    ``table``: :data:`COLUMNS` as numpy arrays, one row per edge (``score``: estimated change of the mean logit
    difference when the edge alone is patched, logits; positions -1 where aggregated; ``candidate``: inside the
    AF1 subgraph, or every edge without one); ``layout``: the graph's shape; ``senders``/``receivers``: node
    names; ``curve``: the faithfulness curve (``None`` with ``--no-curve``); ``clean_metric``: the model's mean
    logit difference; ``config``/``meta``: the settings and the run's description; ``seconds``: wall time."""

    layout: Layout
    senders: list[str]
    receivers: list[str]
    table: dict[str, np.ndarray]
    clean_metric: float
    n_prompts: int
    config: JsonDict
    curve: Curve | None = None
    meta: JsonDict = field(default_factory=dict)
    seconds: float = 0.0

    # --- reading ------------------------------------------------------------------------------------
    def to_pandas(self) -> DataFrame:
        """One row per edge, largest ``|score|`` first: ``src``, ``src_pos``, ``dst``, ``dst_pos``, ``input``
        (``q``/``k``/``v``/``mlp``/``logits``), ``score``, ``candidate``."""
        import pandas as pd

        t = self.table
        frame = pd.DataFrame({
            "src": pd.Categorical.from_codes(t["src"], self.senders),
            "src_pos": t["src_pos"], "dst": np.asarray(self.receivers)[t["dst"]],
            "dst_pos": t["dst_pos"], "input": np.asarray(INPUT_KINDS)[t["input"]], "score": t["score"],
            "candidate": t["candidate"].astype(bool),
        })
        order = np.argsort(-np.abs(t["score"]), kind="stable")
        return frame.iloc[order].reset_index(drop=True)

    def top(self, n: int | None = None, candidates_only: bool = True) -> list[JsonDict]:
        """The ``n`` edges of largest ``|score|`` (default: ``config["top"]``) as dicts."""
        n = int(self.config.get("top", 40)) if n is None else n
        t = self.table
        pool = np.flatnonzero(t["candidate"]) if candidates_only else np.arange(len(t["score"]))
        order = pool[np.argsort(-np.abs(t["score"][pool]), kind="stable")[:n]]
        return [{"src": self.senders[t["src"][i]], "src_pos": int(t["src_pos"][i]),
                 "dst": self.receivers[t["dst"][i]], "dst_pos": int(t["dst_pos"][i]),
                 "input": INPUT_KINDS[t["input"][i]], "score": float(t["score"][i])} for i in order]

    def summary(self) -> JsonDict:
        """What ``edges.json`` holds besides nothing per edge: settings, graph, curve and top edges."""
        curve = None
        if self.curve is not None:
            c = self.curve
            curve = {"points": [asdict(p) for p in c.points], "cpr": c.cpr, "cmd": c.cmd, "cpr_ci": list(c.cpr_ci),
                     "cmd_ci": list(c.cmd_ci), "full": c.full, "empty": c.empty}
        return {"config": self.config, "meta": self.meta, "layout": asdict(self.layout), "senders": self.senders,
                "receivers": self.receivers, "n_edges": int(len(self.table["score"])),
                "n_candidates": int(self.table["candidate"].sum()), "n_prompts": self.n_prompts,
                "clean_metric": self.clean_metric, "curve": curve, "top_edges": self.top(),
                "seconds": round(self.seconds, 1)}

    # --- files --------------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(self.table[k]) for k in COLUMNS}

    @classmethod
    def from_summary(cls, summary: JsonMapping, arrays: dict[str, np.ndarray]) -> EdgesResult:
        c = summary.get("curve")
        curve = None if c is None else Curve(points=[CurvePoint(**p) for p in c["points"]], cpr=c["cpr"],
                                             cmd=c["cmd"], cpr_ci=tuple(c["cpr_ci"]), cmd_ci=tuple(c["cmd_ci"]),
                                             full=c["full"], empty=c["empty"])
        return cls(layout=Layout(**summary["layout"]), senders=list(summary["senders"]),
                   receivers=list(summary["receivers"]), table={k: np.asarray(arrays[k]) for k in COLUMNS},
                   clean_metric=float(summary["clean_metric"]), n_prompts=int(summary["n_prompts"]),
                   config=dict(summary["config"]), curve=curve, meta=dict(summary.get("meta") or {}),
                   seconds=float(summary.get("seconds", 0.0)))

    @classmethod
    def load(cls, run_dir: str | Path) -> EdgesResult:
        """The result stored in ``run_dir`` (``af1 edges --out``)."""
        import json

        path = Path(run_dir)
        if not (path / EDGES_JSON).is_file():
            raise FileNotFoundError(f"{path} holds no {EDGES_JSON}: not a finished af1 edges run")
        summary = json.loads((path / EDGES_JSON).read_text())
        with np.load(path / EDGES_ARRAYS) as npz:
            arrays = {k: npz[k] for k in COLUMNS}
        return cls.from_summary(summary, arrays)

    # --- figures and export -------------------------------------------------------------------------
    def figures(self, n: int | None = None) -> list[Figure]:
        """The graph figure (nodes by block and position, the top ``n`` candidate edges) and the curve."""
        from circuits.edges.figures import curve_figure, graph_figure

        figs = [graph_figure(self, n)]
        if self.curve is not None:
            figs.append(curve_figure(self.curve))
        return figs

    def plot(self, n: int | None = None) -> Figure:
        """The graph figure (a plotly figure; shown inline in a notebook)."""
        return self.figures(n)[0]

    def to_mib(self, path: str | Path | None = None, n_edges: int | None = None) -> JsonDict:
        """The scores in MIB's circuit-track format (:func:`circuits.edges.mib.to_mib`); written to ``path`` when
        given."""
        from circuits.edges.mib import to_mib, write_mib

        doc = to_mib(self, n_edges)
        if path is not None:
            write_mib(path, doc)
        return doc
