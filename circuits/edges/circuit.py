"""Circuits of top edges, evaluated by edge patching; the faithfulness curve, CPR and CMD as MIB defines them.

A circuit is the ``n`` edges of largest absolute score (MIB's ``apply_topn(n, absolute=True)``) among the
candidate edges (every edge, or those of an AF1 subgraph, :func:`af1_allowed`). It is evaluated by **edge
patching** (:func:`circuits.edges.engine.edge_pass`): every receiver reads its senders' outputs of this pass
along kept edges and their counterfactual outputs along every other edge (non-candidates included).

Faithfulness of a circuit ``C`` (MIB): ``f(C) = (m(C) - m(empty)) / (m(model) - m(empty))`` with ``m`` the
metric averaged over prompts (the answer's logit difference). MIB's sizes are the fractions
:data:`MIB_SIZES` of the candidate edges; CPR is the trapezoidal area under ``f`` over the fractions (higher is
better), CMD the area under ``|1 - f|`` (lower is better), both on a linear axis from 0.001 to 1 as MIB's
``evaluate_area_under_curve`` computes them by default. Intervals: a percentile bootstrap over prompts (the
prompts are resampled, every mean recomputed from the resample).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float, Int

from circuits.edges.engine import edge_pass
from circuits.edges.graph import Layout, Scores
from circuits.edges.resume import circuit_key
from circuits.edges.scores import Counter, batches
from circuits.errors import ArgumentError
from interventions.adapter import ModelAdapter

MIB_SIZES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""MIB's circuit sizes: fractions of the candidate edges."""


def af1_allowed(layout: Layout, wait: int, transfer: int) -> Scores:
    """The edges of the AF1 subgraph of ``(wait, transfer)`` (booleans, :mod:`circuits.edges.graph` shapes):
    every edge within a position, every key/value edge from BOS, and the cross-position key/value edges only
    into the answer positions (the last ``n_answer``) in the transfer blocks ``wait+1 .. wait+transfer``."""
    if not layout.positional:
        raise ArgumentError("--wait/--transfer restrict positions: leave out --aggregate-positions")
    if not (-1 <= wait and transfer >= 0 and wait + transfer <= layout.n_layers - 1):
        raise ArgumentError(f"(wait={wait}, transfer={transfer}) does not fit {layout.n_layers} blocks: give "
                            f"-1 <= wait and wait + transfer <= {layout.n_layers - 1}")
    t = layout.n_pos
    src = torch.arange(t)[:, None]
    dst = torch.arange(t)[None, :]
    local = (src == dst) | (src == 0)
    into_last = local | (dst >= t - layout.n_answer)
    out: Scores = {}
    for slot in layout.slots():
        kind, layer = slot
        valid = layout.valid(slot)
        if kind in ("k", "v"):
            pairs = into_last if wait < layer <= wait + transfer else local
            valid = valid & pairs[None, :, None, :]
        out[slot] = valid
    return out


def top_edges(scores: np.ndarray, n: int, candidates: np.ndarray | None = None) -> np.ndarray:
    """Row numbers of the ``n`` candidate edges of largest ``|score|`` (ties: the lower row first)."""
    pool = np.arange(len(scores)) if candidates is None else np.flatnonzero(candidates)
    if n >= len(pool):
        return pool
    order = np.argsort(-np.abs(scores[pool]), kind="stable")
    return pool[order[:n]]


def removal_of(layout: Layout, kept: np.ndarray) -> Scores:
    """Removal weights (1 = patched) of the circuit that keeps edges ``kept`` (row numbers) and removes every
    other edge."""
    return layout.from_table(kept, np.zeros(len(kept)), fill=1.0)


@torch.no_grad()
def circuit_metrics(adapter: ModelAdapter, layout: Layout, tokens: Int[torch.Tensor, "n pos"],
                    answers: Int[torch.Tensor, " n *k"], counter: Counter, removal: float | Scores, *,
                    batch_size: int = 16) -> Float[torch.Tensor, " n"]:
    """The metric per prompt with ``removal`` patched (a number: every edge alike)."""
    out = []
    for rows in batches(len(tokens), batch_size):
        res = edge_pass(adapter, layout, tokens[rows], answers[rows], counter=counter(rows), removal=removal)
        out.append(res.metric.float().cpu())
    return torch.cat(out)


@dataclass(frozen=True)
class CurvePoint:
    """One circuit: ``fraction`` of the candidate edges, ``n_edges`` kept, faithfulness (MIB, a ratio; 1 = the
    model) with its bootstrap interval, mean metric (logits) and the share of prompts still answered
    (metric > 0)."""

    fraction: float
    n_edges: int
    faithfulness: float
    ci_low: float
    ci_high: float
    mean_metric: float
    accuracy: float


def normalised(metric: np.ndarray, full: np.ndarray, empty: np.ndarray) -> float:
    """MIB's faithfulness of mean metrics."""
    den = float(full.mean() - empty.mean())
    return float("nan") if den == 0 else float((metric.mean() - empty.mean()) / den)


def areas(fractions: Sequence[float], faith: Sequence[float]) -> tuple[float, float]:
    """``(CPR, CMD)``: trapezoidal areas under ``f`` and under ``|1 - f|`` over ``fractions`` (linear axis)."""
    x, f = np.asarray(fractions, dtype=float), np.asarray(faith, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    cpr = float(np.sum((x[1:] - x[:-1]) * (f[1:] + f[:-1]) / 2))
    gap = np.abs(1 - f)
    cmd = float(np.sum((x[1:] - x[:-1]) * (gap[1:] + gap[:-1]) / 2))
    return cpr, cmd


@dataclass(frozen=True)
class Curve:
    """The faithfulness curve over circuit sizes and its areas, with bootstrap intervals (``*_ci``: (low,
    high)); ``full``/``empty``: mean metric of the model and of the empty circuit (logits)."""

    points: list[CurvePoint]
    cpr: float
    cmd: float
    cpr_ci: tuple[float, float]
    cmd_ci: tuple[float, float]
    full: float
    empty: float


def faithfulness_curve(
    adapter: ModelAdapter, layout: Layout, tokens: Int[torch.Tensor, "n pos"], answers: Int[torch.Tensor, " n *k"],
    counter: Counter, table_scores: np.ndarray, *, full: Float[torch.Tensor, " n"],
    candidates: np.ndarray | None = None, fractions: Sequence[float] = MIB_SIZES, batch_size: int = 16,
    n_boot: int = 1000, seed: int = 0, on_point: Callable[[int], None] | None = None,
    known: Mapping[str, np.ndarray] | None = None, on_circuit: Callable[[str, np.ndarray], None] | None = None,
) -> Curve:
    """Edge-patching faithfulness of the top-edge circuits at ``fractions`` of the candidate edges (``full``:
    the model's metric per prompt). ``known``: the metric per prompt of circuits evaluated before, by
    :func:`~circuits.edges.resume.circuit_key` (a resumed run does not evaluate them again); ``on_circuit(key,
    metric)`` after each circuit evaluated here (to keep it)."""
    known = known or {}

    def metrics(kept: np.ndarray | None) -> np.ndarray:
        key = circuit_key(kept)
        if key in known and len(known[key]) == len(tokens):
            return known[key]
        removal = 1.0 if kept is None else removal_of(layout, kept)
        m = circuit_metrics(adapter, layout, tokens, answers, counter, removal, batch_size=batch_size).numpy()
        if on_circuit is not None:
            on_circuit(key, m)
        return m

    n_cand = len(table_scores) if candidates is None else int(candidates.sum())
    empty = metrics(None)
    f_all, per = full.numpy(), []
    sizes = []
    for i, frac in enumerate(fractions):
        n = int(frac * n_cand)
        per.append(metrics(top_edges(table_scores, n, candidates)))
        sizes.append(n)
        if on_point is not None:
            on_point(i + 1)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(f_all), size=(n_boot, len(f_all)))
    boot = np.array([[normalised(m[r], f_all[r], empty[r]) for m in per] for r in idx])  # [n_boot, sizes]
    points = []
    for j, (frac, m) in enumerate(zip(fractions, per)):
        lo, hi = np.nanquantile(boot[:, j], [0.025, 0.975]) if np.isfinite(boot[:, j]).any() else (np.nan, np.nan)
        points.append(CurvePoint(fraction=float(frac), n_edges=sizes[j], faithfulness=normalised(m, f_all, empty),
                                 ci_low=float(lo), ci_high=float(hi), mean_metric=float(m.mean()),
                                 accuracy=float((m > 0).mean())))
    cpr, cmd = areas(fractions, [p.faithfulness for p in points])
    boot_areas = np.array([areas(fractions, row) for row in boot])
    cpr_ci = tuple(float(v) for v in np.nanquantile(boot_areas[:, 0], [0.025, 0.975]))
    cmd_ci = tuple(float(v) for v in np.nanquantile(boot_areas[:, 1], [0.025, 0.975]))
    return Curve(points=points, cpr=cpr, cmd=cmd, cpr_ci=(cpr_ci[0], cpr_ci[1]), cmd_ci=(cmd_ci[0], cmd_ci[1]),
                 full=float(f_all.mean()), empty=float(empty.mean()))
