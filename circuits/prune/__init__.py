"""Greedy head pruning inside the AF1 subgraph.

The AF1 subgraph of ``(wait, transfer)`` (:func:`interventions.af1_subgraph`: ablation of the residual
after block ``wait``, transfer blocks ``wait+1 .. wait+transfer`` where the last token full-peeks, every
later block self-peeks) is the starting point. Its *transfer heads* are every query head of the
transfer blocks (``transfer * n_heads`` heads, named ``(layer, head)``, 0-indexed). They are removed
one at a time (:class:`interventions.HeadAblation`, ``method="zero"`` or ``"mean"``) until none is
left, and the whole curve "heads kept vs faithfulness" is recorded.

Criterion ("removes the head that hurts least"). At every step, among the candidates whose removal
was *confirmed* by a real ablation (a forward pass over all prompts with the already removed heads
plus the candidate ablated), the chosen head maximises, in this order:

1. faithfulness after removal (fraction of base-correct prompts whose argmax is still the answer);
2. then the mean logit difference after removal (answer logit minus best other logit, in logits);
3. then the lowest ``(layer, head)`` (deterministic tie-break).

The choice is recomputed after each removal (greedy). Which candidates are confirmed:

* ``rank="attribution"``: one forward + one backward pass on the current pruned subgraph gives, for
  every remaining head, the first-order estimate of the change of the summed logit difference when it
  is removed (:mod:`circuits.prune.attribution`); candidates are sorted by estimate, highest first (ties:
  lowest ``(layer, head)``), and the first ``confirm_top`` of them are confirmed
  (``confirm_top=None``: all of them, which makes the greedy step exact, the estimates then only
  being recorded for diagnostics).
* ``rank="none"``: no attribution pass; every remaining head is confirmed (``confirm_top`` must be
  None).

Cost, in forward passes over the whole prompt set (a *pass*; each may run in several batches): 1 for
the unpruned subgraph, then per step ``min(confirm_top, remaining)`` confirmed passes plus, with
``rank="attribution"``, one forward+backward pass. Exact greedy: ``1 + H(H+1)/2`` confirmed passes for
``H`` transfer heads; ``confirm_top=k``: at most ``1 + k*H``.

Outputs (``out_dir``): ``run.json`` (what identifies the run), ``curve.jsonl`` (one JSON object per
step, appended and fsynced as soon as known), ``summary.json``, ``report.html``, ``prompts.jsonl``,
``means.safetensors``. A second call with the same ``out_dir`` continues from ``curve.jsonl`` by
replaying the removed heads (finished steps are not recomputed); a directory holding another run's
results raises :class:`FileExistsError`. ``target``, ``batch_size`` and ``progress`` are not part of a
run's identity: rerunning with another ``target`` only recomputes the summary and the report.
"""

from circuits.lazy import exports

__all__ = [
    "CURVE_FIELDS", "CurvePoint", "NOT_IDENTITY", "PRUNE", "PruneConfig", "PruneResult", "area_under_curve",
    "head_attention", "key_labels", "prune_heads", "pruned_subgraph", "run_prune", "summary_dict",
    "transfer_heads",
]

__getattr__ = exports(__name__, {
    "NOT_IDENTITY": "circuits.prune.config",
    "PruneConfig": "circuits.prune.config",
    "PRUNE": "circuits.prune.greedy",
    "prune_heads": "circuits.prune.greedy",
    "run_prune": "circuits.prune.greedy",
    "head_attention": "circuits.prune.heads",
    "key_labels": "circuits.prune.heads",
    "pruned_subgraph": "circuits.prune.heads",
    "transfer_heads": "circuits.prune.heads",
    "CURVE_FIELDS": "circuits.prune.result",
    "CurvePoint": "circuits.prune.result",
    "PruneResult": "circuits.prune.result",
    "area_under_curve": "circuits.prune.result",
    "summary_dict": "circuits.prune.result",
})
