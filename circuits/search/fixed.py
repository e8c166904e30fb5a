"""Faithfulness of one fixed AF1 configuration ``(wait, transfer)`` (the paper's "apply the Llama-3-8B
configuration to every style" experiment): the search's evaluator on a single configuration, as an
analysis of its own with one record in ``results.jsonl``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from circuits import files
from circuits.analyses import Analysis, RunContext
from circuits.faithfulness import summarize
from circuits.outcomes import PromptOutcomes
from circuits.runs import RunDir
from circuits.search.analysis import search_identity, search_schema
from circuits.search.evaluators import FastEvaluator
from circuits.search.results import ConfigResult, config_row
from circuits.validation import check_choice, check_config, check_int, check_positive
from circuits.vocab import ABLATIONS, Ablation, Means, means_kind


@dataclass(frozen=True)
class FixedConfig:
    """One configuration: ``wait`` (last waiting block, 0-indexed; -1 = no ablation), ``transfer``
    (number of transfer blocks), ``ablation``, bootstrap ``seed``/``n_boot`` and ``batch_size``."""

    wait: int
    transfer: int
    ablation: Ablation = "cama"
    seed: int = 0
    batch_size: int = 128
    n_boot: int = 1000

    def validate(self, info: Any = None) -> FixedConfig:
        check_choice("ablation", self.ablation, ABLATIONS)
        check_positive("batch_size", self.batch_size)
        check_positive("n_boot", self.n_boot)
        check_int("wait", self.wait, -1)
        check_int("transfer", self.transfer, 0)
        if info is not None:
            check_config(info.n_layers, self.wait, self.transfer)
        return self

    def identity(self) -> dict[str, Any]:
        return {"wait": int(self.wait), "transfer": int(self.transfer), "ablation": self.ablation,
                "seed": int(self.seed), "n_boot": int(self.n_boot)}


def run_fixed(model: Any, config: FixedConfig, ctx: RunContext) -> ConfigResult:
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


def fixed_identity(config: FixedConfig, ctx: RunContext, model: Any) -> dict[str, Any]:
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
