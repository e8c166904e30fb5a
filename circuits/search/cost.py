"""What an AF1 search costs in forward passes (requests on a remote backend) and tokens, before it runs.

Counted for the evaluators of :mod:`circuits.search.evaluators` where several configurations share a
forward pass (:class:`~circuits.search.evaluators.BatchedEvaluator`; on nnsight every forward pass is
one request): the search's own passes over its prompts, plus the ones the runner makes first (one pass
per prompt batch to keep the base-correct prompts, one per batch to fit the means of CAMA / mean
ablation). Prompt preparation (checking prompts in rounds) comes before and is not counted here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from circuits.search.rule import configurations


@dataclass(frozen=True)
class SearchCost:
    """Requests (forward passes) and prompt tokens (every invoke's ``batch * pos``) of a full-grid search.

    ``configs``: configurations of the grid; ``search_requests`` / ``search_tokens``: their evaluation;
    ``setup_requests`` / ``setup_tokens``: the base-correct check and the means fit. The ``auto`` grid
    evaluates a subset, so it costs at most :attr:`requests` (all waits are needed when none is
    sufficient)."""

    configs: int
    search_requests: int
    search_tokens: int
    setup_requests: int
    setup_tokens: int

    @property
    def requests(self) -> int:
        return self.search_requests + self.setup_requests

    @property
    def tokens(self) -> int:
        return self.search_tokens + self.setup_tokens

    def line(self) -> str:
        """One printable line."""
        return (f"full grid: {self.configs} configurations in {self.search_requests} requests "
                f"({self.search_tokens:,} prompt tokens), plus {self.setup_requests} requests "
                f"({self.setup_tokens:,} tokens) for the base-correct check and the means; "
                f"total {self.requests} requests, {self.tokens:,} tokens (the auto grid needs at most this)")


def search_cost(n_layers: int, n_prompts: int, n_pos: int, *, batch_size: int, configs_per_pass: int,
                n_fit: int = 0) -> SearchCost:
    """:class:`SearchCost` of a full-grid search of a model with ``n_layers`` blocks on ``n_prompts`` prompts
    of ``n_pos`` tokens (BOS included), ``batch_size`` prompts per pass and ``configs_per_pass``
    configurations of one wait per pass. ``n_fit``: prompts the means are fitted on (CAMA or mean
    ablation; 0 without means), one pass per batch of them."""
    batches = math.ceil(n_prompts / batch_size)
    configs = configurations(n_layers)
    groups = sum(math.ceil((n_layers - w) / configs_per_pass) for w in range(-1, n_layers))
    return SearchCost(
        configs=len(configs),
        search_requests=groups * batches,
        search_tokens=len(configs) * n_prompts * n_pos,
        setup_requests=batches + math.ceil(n_fit / batch_size),
        setup_tokens=(n_prompts + n_fit) * n_pos,
    )
