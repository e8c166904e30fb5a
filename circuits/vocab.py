"""The analyses' vocabulary, in one place: every choice a command, a config or the API accepts (the
``choices`` of the command line are these tuples), and the one range rule of an AF1 configuration
``(wait, transfer)`` (:func:`config_problem`).

The intervention layer's words (ablations, head methods, backends, the range rule) come from
:mod:`interventions.vocab`. Torch-free: ``af1 --help`` reads it.
"""

from __future__ import annotations

from typing import Literal, get_args

from interventions.vocab import (
    ABLATIONS,
    BACKENDS,
    HEAD_METHODS,
    MEANS_ABLATIONS,
    Ablation,
    Backend,
    HeadMethod,
    config_problem,
)

__all__ = [
    "ABLATIONS", "Ablation", "BACKENDS", "Backend", "DECODES", "DTYPES", "Decode", "Dtype", "GRIDS", "Grid",
    "HEAD_METHODS", "HeadMethod", "MEANS_ABLATIONS", "MODEL_CLASSES", "ModelClass", "POPULATIONS", "Population",
    "RANKS", "Rank", "SEARCH_METHODS", "SOURCES", "SearchMethod", "Source", "config_problem", "FIT_SIZE",
    "FIT_MIN_COUNT", "NUMBERS", "Numbers", "Means", "means_kind",
]

FIT_SIZE = 10_000
"""Default size of the means' fit set (:mod:`circuits.prompts.fitset`): tasks with at most this many prompts are
fitted on their whole layout."""
FIT_MIN_COUNT = 5
"""Default minimum of fit prompts behind each conditional mean a scored prompt reads."""

Grid = Literal["auto", "full"]
"""``auto``: only the configurations the selection needs; ``full``: every one (for the heatmap)."""
GRIDS: tuple[str, ...] = get_args(Grid)

SearchMethod = Literal["fast", "naive"]
"""``fast``: the exact shortcuts; ``naive``: one complete intervened forward pass per configuration."""
SEARCH_METHODS: tuple[str, ...] = get_args(SearchMethod)

Rank = Literal["attribution", "none"]
"""How pruning ranks candidate heads before confirming them with real ablations."""
RANKS: tuple[str, ...] = get_args(Rank)

Source = Literal["build", "frozen"]
"""Evaluation prompts generated with a seed (``build``) or the task's frozen set."""
SOURCES: tuple[str, ...] = get_args(Source)

Numbers = Literal["single", "multi"]
"""How a task's operands and answers may be tokenised: one token each (the AF1 papers) or several
(digit-level tokenizers; :mod:`circuits.tasks.digits`)."""
NUMBERS: tuple[str, ...] = get_args(Numbers)

Population = Literal["all", "correct"]
"""Which task prompts the means are averaged over: ``all`` prompts of the layout (the CAMA formula's
P(x | x_t), the default) or only those the unmodified model answers correctly."""
POPULATIONS: tuple[str, ...] = get_args(Population)


Dtype = Literal["float32", "float16", "bfloat16"]
"""Weight dtype of a pretrained model (zoo models ship in float32 only)."""
DTYPES: tuple[str, ...] = get_args(Dtype)

Decode = Literal["final_norm", "raw"]
"""How the logit lens reads a residual: through the model's final normalisation and the unembedding, or the
unembedding alone."""
DECODES: tuple[str, ...] = get_args(Decode)

ModelClass = Literal["hooked", "transformers"]
"""What a zoo model is trained as: ``HookedTransformer`` (TransformerLens 3.x; defines the shipped models) or
the Hugging Face class (``GPT2LMHeadModel`` / ``LlamaForCausalLM``)."""
MODEL_CLASSES: tuple[str, ...] = get_args(ModelClass)


Means = Literal["cama", "mean", "head"]
"""The means a run needs: ``cama`` (conditional, per ``(position, token)``: the fit set must back every entry a
scored prompt reads), ``mean`` (per position, of the residual stream) or ``head`` (per position, of the heads'
outputs: mean head ablation)."""


def means_kind(ablation: str | None, head_method: str | None = None) -> Means | None:
    """The means an ``ablation`` (and a pruning ``head_method``) needs: ``"cama"``, ``"mean"``, ``"head"`` or
    ``None`` (zero ablation with zero head ablation: none). The prepared prompts are drawn for it
    (:meth:`circuits.prompts.spec.PromptSpec.prepare`)."""
    if ablation == "cama":
        return "cama"
    if ablation == "mean":
        return "mean"
    return "head" if head_method == "mean" else None
