"""Edge scores: EAP and EAP-IG against a counterfactual (CAMA means, plain means, zero, or a corrupted prompt).

The score of an edge ``u -> v`` estimates ``M(edge patched) - M(clean)``, the change of the metric (the answer's
logit difference, :func:`circuits.edges.engine.logit_diff`) when ``v`` reads ``u``'s counterfactual output
instead of its clean one, averaged over prompts (units: logits; negative = the edge helps the answer):

* ``eap``: ``(u' - u) . dM/d(input_v)`` with the gradient at the clean run (one forward and backward pass);
* ``eap-ig``: the gradient averaged over ``steps`` points ``k/steps`` (``k = 1..steps``) on the straight line
  from the counterfactual input to the clean input (the embedding's output, as in Hanna et al. 2024,
  "inputs" variant): ``steps`` forward and backward passes.

Counterfactual outputs ``u'`` per sender and position: ``zero``; ``mean`` (each sender's mean output at that
position over the fit set); ``cama`` (its mean over the fit prompts holding the same token at that position:
the embedding keeps its own value, so EAP-IG's input path is constant and EAP-IG equals EAP there); and
``corrupted`` (its output on another prompt of the same layout: prompt ``i`` reads prompt ``i+1``'s, cyclically,
so the operands differ).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from circuits.edges.engine import Metric, PassResult, edge_pass, logit_diff
from circuits.edges.graph import Layout, Scores, zeros
from circuits.edges.resume import Partial
from circuits.errors import ArgumentError
from interventions.adapter import ModelAdapter

Counter = Callable[[Int[torch.Tensor, " batch"]], Float[torch.Tensor, "batch n_senders pos d_model"]]
"""The counterfactual outputs of the scored prompts with these row numbers."""


def batches(n: int, size: int) -> Iterator[Int[torch.Tensor, " rows"]]:
    """Row numbers ``0..n-1`` in runs of ``size``."""
    for start in range(0, n, size):
        yield torch.arange(start, min(n, start + size))


@dataclass
class MeanOutputs:
    """Senders' mean outputs over a fit set: per position (``mean``), and per position and token (``cama``)."""

    mean: Float[torch.Tensor, "n_senders pos d_model"]
    by_token: dict[tuple[int, int], Float[torch.Tensor, "n_senders d_model"]]
    counts: dict[tuple[int, int], int]

    def lookup(self, tokens: Int[torch.Tensor, "batch pos"], min_count: int = 1) -> Float[torch.Tensor, "b s p d"]:
        """The conditional means of prompts ``tokens``: ``[batch, n_senders, pos, d_model]``. A ``(position,
        token)`` with fewer than ``min_count`` fit prompts raises :class:`ArgumentError`."""
        rows = []
        for row in tokens.tolist():
            cols = []
            for pos, tok in enumerate(row):
                n = self.counts.get((pos, tok), 0)
                if n < min_count:
                    raise ArgumentError(
                        f"no CAMA mean for token id {tok} at position {pos}: the fit set holds it {n} times (needs "
                        f">= {min_count}); draw a larger fit set (--fit-prompts) or use --counterfactual mean")
                cols.append(self.by_token[(pos, tok)])
            rows.append(torch.stack(cols, dim=1))
        return torch.stack(rows)


@torch.no_grad()
def mean_outputs(adapter: ModelAdapter, layout: Layout, fit: Int[torch.Tensor, "n_fit pos"],
                 batch_size: int = 64) -> MeanOutputs:
    """Every sender's mean output over the fit prompts ``fit`` (one layout), per position and per (position,
    token); sums in float64."""
    flat = Layout(**{**layout.__dict__, "positional": False})
    total: torch.Tensor | None = None
    by_token: dict[tuple[int, int], torch.Tensor] = {}
    counts: dict[tuple[int, int], int] = {}
    dummy = torch.zeros(1, dtype=torch.long)
    for rows in batches(len(fit), batch_size):
        toks = fit[rows]
        out = edge_pass(adapter, flat, toks, dummy.expand(len(rows)), leaves=False).outputs.double().cpu()
        total = out.sum(0) if total is None else total + out.sum(0)
        for i, row in enumerate(toks.tolist()):
            for pos, tok in enumerate(row):
                key = (pos, tok)
                by_token[key] = by_token[key] + out[i, :, pos] if key in by_token else out[i, :, pos].clone()
                counts[key] = counts.get(key, 0) + 1
    if total is None:
        raise ArgumentError("the fit set is empty: the mean and CAMA counterfactuals need fit prompts")
    return MeanOutputs(mean=(total / len(fit)).float(),
                       by_token={k: (v / counts[k]).float() for k, v in by_token.items()}, counts=counts)


def corrupted_rows(n: int) -> Int[torch.Tensor, " n"]:
    """The prompt each scored prompt reads its counterfactual from: the next one, cyclically."""
    if n < 2:
        raise ArgumentError("the corrupted counterfactual needs at least 2 prompts of one layout (--prompts)")
    return torch.roll(torch.arange(n), -1)


def counterfactual(kind: str, adapter: ModelAdapter, layout: Layout, tokens: Int[torch.Tensor, "n pos"],
                   means: MeanOutputs | None = None, min_count: int = 1) -> Counter:
    """The :data:`Counter` of counterfactual ``kind`` for the scored prompts ``tokens``."""
    device = adapter.device()
    shape = (layout.n_senders, layout.n_pos, layout.d_model)
    if kind == "zero":
        return lambda rows: torch.zeros(len(rows), *shape, device=device)
    if kind in ("mean", "cama"):
        if means is None:
            raise ArgumentError(f"the {kind} counterfactual needs the fit set's mean outputs")
        if kind == "mean":
            return lambda rows: means.mean.to(device).expand(len(rows), *shape)
        return lambda rows: means.lookup(tokens[rows], min_count).to(device)
    if kind == "corrupted":
        source = corrupted_rows(len(tokens))
        flat = Layout(**{**layout.__dict__, "positional": False})
        dummy = torch.zeros(1, dtype=torch.long)

        def corrupted(rows: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return edge_pass(adapter, flat, tokens[source[rows]], dummy.expand(len(rows))).outputs

        return corrupted
    raise ArgumentError(f"counterfactual {kind!r} is not valid: choose cama, mean, zero or corrupted")


def contract(layout: Layout, delta: Float[torch.Tensor, "b s p d"], grads: dict) -> Scores:
    """``sum over prompts of delta_u . grad_v`` for every edge: the summed first-order change per edge."""
    out: Scores = {}
    for slot in layout.slots():
        kind, layer = slot
        n = layout.n_up(kind, layer)
        d, g = delta[:, :n].to(grads[slot].dtype), grads[slot]
        if kind == "q":
            s = torch.einsum("bntd,bthd->nth", d, g)
        elif kind in ("k", "v"):
            s = torch.einsum("bnpd,bcpkd->npkc", d, g)
        else:
            s = torch.einsum("bntd,btd->nt", d, g)
        if not layout.positional:
            s = s.sum(1, keepdim=True)
        out[slot] = s.float().cpu()
    return out


def attribute(
    adapter: ModelAdapter,
    layout: Layout,
    tokens: Int[torch.Tensor, "n pos"],
    answers: Int[torch.Tensor, " n *k"],
    counter: Counter,
    *,
    method: str = "eap-ig",
    steps: int = 5,
    path: str = "inputs",
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
    metric: Metric = logit_diff,
    start: Partial | None = None,
    on_partial: Callable[[Partial], None] | None = None,
) -> tuple[Scores, Float[torch.Tensor, " n"]]:
    """Per-edge scores (mean over prompts, logits) and the clean metric per prompt. ``method`` ``eap`` or
    ``eap-ig`` (``steps`` points ``k/steps``, ``k = 1..steps``) along ``path``: ``inputs`` (the embedding's
    output moves from the counterfactual to the clean one; the edges' differences are taken at the clean run)
    or ``edges`` (every edge of the graph is removed by the same fraction ``1 - k/steps``, so the path runs from
    the empty circuit to the model; each point's differences are its own, and the scores of all edges add up
    to ``M(model) - M(empty circuit)`` as ``steps`` grows). ``on_batch(n_done)`` after each batch; ``metric``: per
    prompt, from the answer logits (default: the answer's logit difference). ``start``: the sums of the first
    prompts, done before (a resumed run goes on from there); ``on_partial(partial)`` after each batch with the sums
    so far (:class:`~circuits.edges.resume.Partial`, to keep them)."""
    if method not in ("eap", "eap-ig"):
        raise ArgumentError(f"method {method!r} is not valid: choose eap or eap-ig")
    if path not in ("inputs", "edges"):
        raise ArgumentError(f"path {path!r} is not valid: choose inputs or edges")
    n_points = 1 if method == "eap" else steps
    acc = zeros(layout) if start is None else {slot: t.clone() for slot, t in start.sums.items()}
    clean_metric = [] if start is None else [start.clean.float().cpu()]
    done = 0 if start is None else start.done
    if on_batch is not None and done:
        on_batch(done)
    params = list(adapter.model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        first = done
        for rows in batches(len(tokens) - first, batch_size):
            rows = rows + first
            toks, ans = tokens[rows], answers[rows]
            cf = counter(rows)
            sums, clean = one_batch(adapter, layout, toks, ans, cf, n_points, path, metric)
            for slot in acc:
                acc[slot] += sums[slot]
            clean_metric.append(clean.float().cpu())
            done = int(rows[-1]) + 1
            if on_partial is not None:
                on_partial(Partial(done=done, sums=acc, clean=torch.cat(clean_metric), batch_size=batch_size))
            if on_batch is not None:
                on_batch(done)
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
    n = len(tokens)
    return {slot: t / n for slot, t in acc.items()}, torch.cat(clean_metric)


def one_batch(adapter: ModelAdapter, layout: Layout, toks: Int[torch.Tensor, "batch pos"],
              ans: Int[torch.Tensor, " batch *k"], cf: Float[torch.Tensor, "batch n_senders pos d_model"],
              n_points: int, path: str, metric: Metric) -> tuple[Scores, Float[torch.Tensor, " batch"]]:
    """Summed scores of one batch of prompts (``n_points`` gradient points along ``path``; logits) and their clean
    metric per prompt (see :func:`attribute`); ``cf``: every sender's counterfactual output."""
    if path == "edges" and n_points > 1:
        acc = zeros(layout)
        last = None
        for k in range(1, n_points + 1):
            res = edge_pass(adapter, layout, toks, ans, counter=cf, removal=1 - k / n_points, leaves=True,
                            metric=metric)
            part = contract(layout, cf.to(res.outputs.dtype) - res.outputs, res.grads)
            for slot in acc:
                acc[slot] += part[slot] / n_points
            last = res.metric
        assert last is not None
        return acc, last
    clean: PassResult | None = None
    grad_sum: dict = {}
    for k in range(1, n_points + 1):
        embed = None
        if k < n_points:
            if clean is None:
                with torch.no_grad():
                    clean = edge_pass(adapter, layout, toks, ans, metric=metric)
            e_clean, e_cf = clean.outputs[:, 0], cf[:, 0].to(clean.outputs.dtype)
            embed = e_cf + (k / n_points) * (e_clean - e_cf)
        res = edge_pass(adapter, layout, toks, ans, embed=embed, leaves=True, metric=metric)
        for slot, g in res.grads.items():
            grad_sum[slot] = g / n_points if slot not in grad_sum else grad_sum[slot] + g / n_points
        if k == n_points:
            clean = res
    assert clean is not None
    return contract(layout, cf.to(clean.outputs.dtype) - clean.outputs, grad_sum), clean.metric
