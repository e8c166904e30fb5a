"""The analyses' vocabulary, in one place: every choice a command, a config or the API accepts, and the one
range rule of an AF1 configuration ``(wait, transfer)``.

The intervention layer's words (ablations, head methods) come from :mod:`interventions.vocab`.
"""

from __future__ import annotations

from typing import Literal, get_args

from interventions.vocab import ABLATIONS, HEAD_METHODS, MEANS_ABLATIONS, Ablation, HeadMethod

__all__ = [
    "ABLATIONS", "Ablation", "GRIDS", "Grid", "HEAD_METHODS", "HeadMethod", "MEANS_ABLATIONS", "POPULATIONS",
    "Population", "RANKS", "Rank", "SEARCH_METHODS", "SOURCES", "SearchMethod", "Source", "config_problem",
    "FIT_SIZE", "FIT_MIN_COUNT", "NUMBERS", "Numbers", "Means", "means_kind",
]

FIT_SIZE = 10_000
"""Default size of the means' fit set (:mod:`circuits.fitset`): tasks with at most this many prompts are
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
(digit-level tokenizers; :mod:`circuits.digits`)."""
NUMBERS: tuple[str, ...] = get_args(Numbers)

Population = Literal["all", "correct"]
"""Which task prompts the means are averaged over: ``all`` prompts of the layout (the CAMA formula's
P(x | x_t), the default) or only those the unmodified model answers correctly."""
POPULATIONS: tuple[str, ...] = get_args(Population)


Means = Literal["cama", "mean", "head"]
"""The means a run needs: ``cama`` (conditional, per ``(position, token)``: the fit set must back every entry a
scored prompt reads), ``mean`` (per position, of the residual stream) or ``head`` (per position, of the heads'
outputs: mean head ablation)."""


def means_kind(ablation: str | None, head_method: str | None = None) -> Means | None:
    """The means an ``ablation`` (and a pruning ``head_method``) needs: ``"cama"``, ``"mean"``, ``"head"`` or
    ``None`` (zero ablation with zero head ablation: none). The prepared prompts are drawn for it
    (:meth:`circuits.specs.PromptSpec.prepare`)."""
    if ablation == "cama":
        return "cama"
    if ablation == "mean":
        return "mean"
    return "head" if head_method == "mean" else None


def config_problem(n_layers: int, wait: object, transfer: object, *, min_transfer: int = 0) -> str | None:
    """What is wrong with the AF1 configuration ``(wait, transfer)`` of a model of ``n_layers`` blocks, or
    ``None``: ``wait`` (the 0-indexed last waiting block, ``-1`` = no ablation) in ``-1 .. n_layers-1`` and
    ``transfer`` (the number of transfer blocks ``wait+1 .. wait+transfer``) in ``min_transfer ..
    n_layers-1-wait``."""
    def is_int(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    top = n_layers - 1 - min_transfer
    if not is_int(wait) or not -1 <= wait <= top:  # type: ignore[operator]
        return f"wait={wait!r} is out of range: valid -1..{top} for a model of {n_layers} blocks (-1 = no ablation)"
    limit = n_layers - 1 - wait  # type: ignore[operator]
    if not is_int(transfer) or not min_transfer <= transfer <= limit:  # type: ignore[operator]
        return (f"transfer={transfer!r} is out of range for wait={wait}: valid {min_transfer}..{limit} "
                f"({n_layers} blocks)")
    return None
