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
from typing import Any

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


# --- floating-point operations of the fast search (the compute limit of benchmarks/bench_search.py) ---------
@dataclass(frozen=True)
class Dims:
    """The shapes that set a model's matmul work: blocks, width, query and key/value heads of ``d_head``,
    MLP width (``gated``: three MLP matrices, else two) and vocabulary."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    gated: bool

    @classmethod
    def of(cls, cfg: Any) -> Dims:
        """The dims of a TransformerLens config (``model.cfg``)."""
        n_heads = int(cfg.n_heads)
        return cls(n_layers=int(cfg.n_layers), d_model=int(cfg.d_model), n_heads=n_heads,
                   n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or n_heads), d_head=int(cfg.d_head),
                   d_mlp=int(cfg.d_mlp), d_vocab=int(cfg.d_vocab), gated=bool(getattr(cfg, "gated_mlp", False)))

    def block_flops(self, tokens: int, keys: int) -> int:
        """FLOP (2 per multiply-add) of one block over ``tokens`` query rows that each attend to ``keys`` keys:
        the q/k/v/o projections, scores and weighted values, and the MLP."""
        d, hd, kvd = self.d_model, self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        proj = d * hd + 2 * d * kvd + hd * d
        attn = 2 * self.n_heads * self.d_head * keys
        mlp = (3 if self.gated else 2) * d * self.d_mlp
        return 2 * tokens * (proj + attn + mlp)

    def unembed_flops(self, rows: int) -> int:
        """FLOP of unembedding ``rows`` residual rows."""
        return 2 * rows * self.d_model * self.d_vocab


def fast_flops(dims: Dims, n_prompts: int, n_pos: int, n_answer: int, *, shared: bool = False,
               n_distinct: int | None = None) -> dict[str, int]:
    """FLOP of the fast full-grid search (:class:`~circuits.search.evaluators.FastEvaluator`, ``tail="last"``)
    on ``n_prompts`` prompts of ``n_pos`` tokens with answers of ``n_answer`` tokens, by phase:

    * ``prefix``: for each wait ``w`` (``-1 .. n_layers-1``) the transfer blocks ``w+1 .. n_layers-1`` over every
      position of every prompt (one prompt for waits ``>= 0`` when ``shared``: the mean/zero baselines);
    * ``tails``: each configuration's self-peek blocks after its transfers on its ``n_answer`` answer rows per
      prompt, each attending to BOS and itself (``n_distinct`` prompts for ``transfer = 0``: one per distinct
      answer-position tokens; default every prompt);
    * ``unembed``: the answer rows of every configuration.

    The lookup of the ablated residual and the readout are not matmuls and not counted."""
    L = dims.n_layers
    distinct = n_prompts if n_distinct is None else n_distinct
    out = {"prefix": 0, "tails": 0, "unembed": 0}
    for w in range(-1, L):
        n = 1 if (shared and w >= 0) else n_prompts
        out["prefix"] += (L - 1 - w) * dims.block_flops(n * n_pos, n_pos)
        for t in range(L - w):
            rows = (1 if (shared and w >= 0) else distinct if t == 0 else n_prompts) * n_answer
            out["tails"] += (L - 1 - w - t) * dims.block_flops(rows, 2)
            out["unembed"] += dims.unembed_flops(rows)
    return out


def naive_flops(dims: Dims, n_prompts: int, n_pos: int) -> int:
    """FLOP of one complete forward pass per configuration of the full grid (every position unembedded)."""
    per_pass = dims.n_layers * dims.block_flops(n_prompts * n_pos, n_pos) + dims.unembed_flops(n_prompts * n_pos)
    return len(configurations(dims.n_layers)) * per_pass
