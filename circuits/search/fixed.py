"""Faithfulness of one fixed AF1 configuration ``(wait, transfer)`` (the paper's "apply the Llama-3-8B
configuration to every style" experiment): the search's evaluator on a single configuration, as an
analysis of its own with one record in ``results.jsonl``."""

from __future__ import annotations

from circuits.analyses import Analysis, RunContext
from circuits.faithfulness import summarize
from circuits.search.config import FixedConfig
from circuits.search.evaluators import FastEvaluator
from circuits.search.results import ConfigResult, config_row
from circuits.search.schema import search_identity, search_schema
from circuits.store import files
from circuits.store.outcomes import PromptOutcomes
from circuits.store.runs import RunDir
from circuits.vocab import Means, means_kind
from interventions.types import JsonDict, Model


def run_fixed(model: Model, config: FixedConfig, ctx: RunContext) -> ConfigResult:
    """The configuration's :class:`ConfigResult` (read from ``ctx.store`` when already computed)."""
    for rec in ctx.store.records():
        return ConfigResult.from_dict(rec)
    evaluator = FastEvaluator(model, ctx.tokens, ctx.answers, ctx.cache, config.ablation, config.batch_size)
    per = evaluator.evaluate(config.wait, config.transfer)
    res = summarize(*per, n_boot=config.n_boot, seed=config.seed)
    result = ConfigResult.from_faithfulness(config.wait, config.transfer, res, config.ablation,
                                            outcomes=PromptOutcomes.from_metrics(*per))
    ctx.store.append(result.to_dict())
    return result


def fixed_identity(config: FixedConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The search's identity fields for these prompts, plus the configuration (``analysis: "fixed"``)."""
    return {**search_identity(config, ctx, model), "analysis": "fixed"}


def write_fixed(result: ConfigResult, run_dir: RunDir, ctx: RunContext) -> None:
    """``summary.json``: the configuration's faithfulness with its interval and the run's description."""
    run_dir.write_json(files.SUMMARY, {
        **{k: ctx.meta.get(k) for k in ("model", "task", "source", "base_accuracy", "n_checked", "command")},
        "n_prompts": int(ctx.tokens.shape[0]),
        "result": result.to_dict(),
        "fit": ctx.means_summary(),
        "identity": run_dir.identity,
    })


def fixed_means(config: FixedConfig) -> Means | None:
    """The means of the configuration's ablation (:func:`circuits.vocab.means_kind`)."""
    return means_kind(config.ablation)


FIXED: Analysis[FixedConfig, ConfigResult] = Analysis(
    name="fixed",
    config_type=FixedConfig,
    results_file=files.SEARCH_RESULTS,
    identity=fixed_identity,
    schema=search_schema,
    run=run_fixed,
    write=write_fixed,
    means=fixed_means,
    summary_row=config_row,
)
"""One fixed configuration as the runner runs it."""

__all__ = ["FIXED", "FixedConfig", "run_fixed"]
