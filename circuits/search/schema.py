"""What a search's run records and is identified by: the identity in ``run.json`` and the schema every
``results.jsonl`` line is checked against on resume and load (shared by :mod:`.analysis`, :mod:`.fixed` and
:mod:`.results`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import interventions as iv
from circuits.analyses import RunContext
from circuits.faithfulness import bootstrap_ci
from circuits.search.config import FixedConfig, SearchConfig
from circuits.store.outcomes import decode_mask
from circuits.store.records import Field, RecordSchema, faithfulness_fields, layer_field
from circuits.store.runs import tokens_sha256
from circuits.vocab import means_kind
from interventions.types import JsonDict, Model

if TYPE_CHECKING:
    from interventions.adapter import ModelInfo

__all__ = ["NOT_IDENTITY", "record_schema", "search_identity", "search_schema"]

NOT_IDENTITY = ("command", "base_accuracy", "n_checked")
"""Keys of a run's description that do not determine its records."""


def search_identity(config: SearchConfig | FixedConfig, ctx: RunContext, model: Model) -> JsonDict:
    """The run identity of a search (the keys of the first release, so that its directories resume)."""
    ad = iv.adapt(model)
    return {
        **{k: v for k, v in ctx.meta.items() if k not in NOT_IDENTITY},
        "n_prompts": int(ctx.tokens.shape[0]),
        "prompts_sha256": tokens_sha256(ctx.tokens, ctx.answers),
        "model_signature": ad.model_identity(),
        **config.identity(),
        # The fit set (how it was drawn, its hash) or a given cache's hash, and the minimum count.
        "means": ctx.means_identity if means_kind(config.ablation) is not None else None,
    }


def search_schema(config: SearchConfig | FixedConfig, info: ModelInfo, n_prompts: int) -> RecordSchema:
    """The schema of a ``results.jsonl`` line of this run (ranges of this model and prompt count)."""
    return record_schema(info.n_layers, n_prompts, config.ablation, seed=config.seed, n_boot=config.n_boot)


def record_schema(n_layers: int, n_prompts: int, ablation: str | None, *, seed: int | None = None,
                  n_boot: int | None = None) -> RecordSchema:
    """The schema of a ``results.jsonl`` line of a search of a model of ``n_layers`` blocks on ``n_prompts``
    prompts with ``ablation`` (``None``: any): the ranges of :func:`search_schema`, the per-prompt outcomes
    consistent with the totals (:func:`circuits.store.outcomes.record_problem`) and, given the run's bootstrap ``seed``
    and ``n_boot``, a confidence interval equal to the one those outcomes give."""
    n = n_layers

    def check(rec: JsonDict) -> tuple[str, str] | None:
        limit = n - 1 - rec["wait"]
        if rec["transfer"] > limit:
            return "transfer", f"= {rec['transfer']} exceeds {limit} for wait={rec['wait']}"
        if seed is None or n_boot is None or not isinstance(rec.get("prompt_faithful"), str):
            return None
        flags = decode_mask(rec["prompt_faithful"], rec["n"]).astype(np.float64)
        for name, value in zip(("ci_low", "ci_high"), bootstrap_ci(flags, n_boot=n_boot, seed=seed)):
            if isinstance(rec.get(name), (int, float)) and abs(rec[name] - value) > 1e-9:
                return name, (f"= {rec[name]!r} is not the bootstrap interval of the stored per-prompt outcomes "
                              f"({n_boot} resamples, seed {seed}: {value!r})")
        return None

    choices = (ablation,) if ablation is not None else None
    return RecordSchema(
        fields=(layer_field("wait", n, lo=-1), Field("transfer", "int", 0, n), *faithfulness_fields(n_prompts),
                Field("ablation", "str", choices=choices, required=False)),
        key=("wait", "transfer"),
        check=check,
    )
