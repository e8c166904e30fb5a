"""``af1 edges`` as an analysis of the runner: edge scores (EAP / EAP-IG) of the prompts, the faithfulness curve
of the top-edge circuits by edge patching (pure), its run identity and its outputs (``edges.npz``,
``edges.json``, ``mib.json``, ``report.html``). A killed run resumes (:mod:`circuits.edges.resume`): the score
sums are kept as a checkpoint between batches, the fit set's mean outputs once computed, each evaluated circuit of
the curve as a line of its results file."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from circuits.analyses import Analysis, RunContext
from circuits.edges.config import EdgesConfig
from circuits.edges.result import EDGES_ARRAYS, EDGES_JSON, EdgesResult
from circuits.edges.resume import CURVE, MEANS, SUMS, Keeper, Partial, curve_schema, known_circuits
from circuits.logs import get_logger
from circuits.store import files

if TYPE_CHECKING:
    from circuits.edges.graph import Layout
    from circuits.edges.scores import MeanOutputs
    from circuits.store.runs import RunDir
    from interventions.adapter import ModelAdapter, ModelInfo
    from interventions.types import JsonDict, Model

__all__ = ["EDGES", "edges_identity", "edges_run", "fit_means", "layout_of", "write_edges"]

MIB_FILE = files.MIB


def layout_of(info: ModelInfo, n_pos: int, n_answer: int, positional: bool) -> Layout:
    """The :class:`~circuits.edges.graph.Layout` of a model (its :class:`~interventions.ModelInfo`) on prompts of
    ``n_pos`` tokens whose last ``n_answer`` positions predict the answer."""
    from circuits.edges.graph import Layout

    return Layout(n_layers=info.n_layers, n_heads=info.n_heads, n_kv_heads=info.n_kv_heads, d_model=info.d_model,
                  n_pos=n_pos, n_answer=n_answer, parallel=info.parallel_attn_mlp, positional=positional)


def edges_run(model: Model, config: EdgesConfig, ctx: RunContext) -> EdgesResult:
    """Score every edge of the graph on the kept prompts, then (``config.curve``) evaluate the top-edge circuits
    at MIB's sizes by edge patching (pure)."""
    import numpy as np
    import torch

    import interventions as iv
    from circuits.edges import scores as sc
    from circuits.edges.circuit import af1_allowed, faithfulness_curve

    t0 = time.time()
    ad = iv.adapt(model)
    tokens, answers = ctx.tokens, torch.as_tensor(ctx.answers)
    n_answer = 1 if answers.ndim == 1 else int(answers.shape[1])
    layout = layout_of(ad.info, int(tokens.shape[1]), n_answer, not config.aggregate_positions)
    log = get_logger("edges")
    log.info("edges: %d edges, about %.1f MiB for the graph at batch %d", layout.n_edges(),
             layout.memory_bytes(config.batch_size) / 2**20, config.batch_size)
    means = fit_means(ad, layout, config, ctx) if config.counterfactual in ("cama", "mean") else None
    min_count = 1 if ctx.fit is None else int(ctx.fit.spec.min_count)
    counter = sc.counterfactual(config.counterfactual, ad, layout, tokens, means, min_count)
    bar = _bar(ctx.progress, len(tokens), "edges: scoring")
    kept = ctx.checkpoints.load(SUMS)
    start = None if kept is None else Partial.from_bytes(kept, layout, len(tokens))
    if start is not None:
        log.info("edges: resuming the scores after %d of %d prompts (%s)", start.done, len(tokens), SUMS)
    keeper = Keeper(lambda data: ctx.checkpoints.keep(SUMS, data), len(tokens))
    scores, clean = sc.attribute(ad, layout, tokens, answers, counter, method=config.method, steps=config.steps,
                                 path=config.ig_path, batch_size=config.batch_size, on_batch=bar, start=start,
                                 on_partial=keeper)
    table = layout.edge_table(scores)
    subgraph = config.subgraph()
    if subgraph is None:
        table["candidate"] = np.ones(len(table["score"]), dtype=np.int32)
    else:
        allowed = af1_allowed(layout, *subgraph)
        table["candidate"] = layout.edge_table({k: v.float() for k, v in allowed.items()})["score"].astype(np.int32)
    curve = None
    if config.curve:
        from circuits.edges.circuit import MIB_SIZES

        point_bar = _bar(ctx.progress, len(MIB_SIZES), "edges: circuits")
        curve = faithfulness_curve(ad, layout, tokens, answers, counter, table["score"], full=clean,
                                   candidates=table["candidate"].astype(bool), batch_size=config.batch_size,
                                   n_boot=config.n_boot, seed=config.seed, on_point=point_bar,
                                   known=known_circuits(ctx.store.records()),
                                   on_circuit=lambda key, m: ctx.store.append({"circuit": key, "metric": m.tolist()}))
    receivers = layout.receiver_names()
    return EdgesResult(layout=layout, senders=layout.sender_names(), receivers=receivers, table=table,
                       clean_metric=float(clean.mean()), n_prompts=int(len(tokens)),
                       config=_config_dict(config), curve=curve,
                       meta={k: v for k, v in ctx.meta.items() if isinstance(v, (str, int, float, bool))},
                       seconds=time.time() - t0)


def fit_means(ad: ModelAdapter, layout: Layout, config: EdgesConfig, ctx: RunContext) -> MeanOutputs:
    """The senders' mean outputs over the run's fit set (``ctx.fit``): read from the run's checkpoint
    :data:`~circuits.edges.resume.MEANS` when a killed or finished run kept them (checked against ``layout``),
    else computed (one pass over the fit set, :func:`~circuits.edges.scores.mean_outputs`) and kept there at once,
    bound to the run's identity."""
    from circuits.edges import scores as sc
    from circuits.errors import ArgumentError

    if ctx.fit is None:
        raise ArgumentError(f"--counterfactual {config.counterfactual} needs a fit set (the runner draws it)")
    kept = ctx.checkpoints.load(MEANS)
    if kept is not None:
        get_logger("edges").info("edges: the fit set's means read back (%s)", MEANS)
        return sc.MeanOutputs.from_bytes(kept, layout, MEANS)
    means = sc.mean_outputs(ad, layout, ctx.fit.tokens, config.batch_size)
    ctx.checkpoints.keep(MEANS, means.to_bytes())
    return means


def _bar(show: bool, total: int, what: str) -> Callable[[int], None] | None:
    """A callback ``(n_done) -> None`` moving a tqdm bar (``None`` when bars are off)."""
    if not show:
        return None
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=what, leave=False)

    def step(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return step


def _config_dict(config: EdgesConfig) -> JsonDict:
    from dataclasses import asdict

    return asdict(config)


def edges_identity(config: EdgesConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The run identity of ``af1 edges``: the prompts, the model and every setting that changes a number."""
    import interventions as iv
    from circuits.store.runs import tokens_sha256

    ad = iv.adapt(model)
    fields = _config_dict(config)
    fields.pop("batch_size")
    fields.pop("top")  # what the summary lists, not a number
    return {
        **{k: v for k, v in ctx.meta.items() if k in ("model", "task", "seed", "numbers", "format")},
        "analysis": "edges",
        "n_prompts": int(ctx.tokens.shape[0]),
        "prompts_sha256": tokens_sha256(ctx.tokens, ctx.answers),
        "model_signature": ad.model_identity(),
        "fit": None if ctx.fit is None else ctx.fit.identity(),
        **{f"edges_{k}": v for k, v in fields.items()},
    }


def write_edges(result: EdgesResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``edges.npz``, ``edges.json``, ``mib.json`` (MIB's circuit-track format) and ``report.html``."""
    import io

    import numpy as np

    from circuits.edges.report import write_edges_report
    from circuits.store.atomic import write_bytes
    from circuits.store.files import REPORT

    buf = io.BytesIO()
    np.savez_compressed(buf, **result.arrays())  # type: ignore[arg-type]
    write_bytes(run_dir.path / EDGES_ARRAYS, buf.getvalue())
    run_dir.write_json(EDGES_JSON, result.summary())
    result.to_mib(run_dir.path / MIB_FILE)
    write_edges_report(run_dir.path / REPORT, result)


def edges_row(result: EdgesResult) -> JsonDict:
    """A sweep row: the CPR (in the faithfulness column) with its interval."""
    if result.curve is None:
        return {}
    return {"faithfulness": result.curve.cpr, "ci_low": result.curve.cpr_ci[0], "ci_high": result.curve.cpr_ci[1]}


EDGES: Analysis[EdgesConfig, EdgesResult] = Analysis(
    name="edges",
    config_type=EdgesConfig,
    results_file=CURVE,
    identity=edges_identity,
    run=edges_run,
    write=write_edges,
    means=lambda config: config.means_kind(),
    summary_row=edges_row,
    schema=curve_schema,
)
"""``af1 edges`` as the runner runs it."""
