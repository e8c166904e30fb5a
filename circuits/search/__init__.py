"""AF1 search: the latest ``wait`` and the shortest ``transfer`` that keep the model faithful.

A configuration ``(wait, transfer)`` of a model with ``n_layers`` blocks (0-indexed) is the subgraph
``interventions.af1_subgraph(n_layers, wait, transfer, cache, ablation)``:

* the residual after block ``wait`` (``blocks.{wait}.hook_resid_post``) is ablated at every position but
  BOS (position 0): CAMA by default, or the plain-mean / zero baselines; ``wait=-1``: no ablation;
* in blocks ``wait+1 .. wait+transfer`` the last token sees every earlier token (full peek) while every
  other token sees only BOS and itself (self peek);
* in every later block all tokens self-peek.

``wait`` ranges over ``-1 .. n_layers-1`` and ``transfer`` over ``0 .. n_layers-1-wait``.

Selection rule: among the configurations with faithfulness ``>= threshold``, the one with the largest
``wait``; ties broken by the smallest ``transfer``. ``None`` when no configuration is sufficient.

Two evaluation methods give the same numbers:

* ``method="naive"``: one complete intervened forward pass per configuration (``faithfulness`` with
  ``af1_subgraph``), the reference.
* ``method="fast"``: exact shortcuts. (1) CAMA / mean / zero ablation make blocks ``0..wait`` unnecessary:
  the residual after block ``wait`` is a table lookup of the cached means, with the model's own BOS
  state at position 0 (BOS only attends to itself, so its state is the same in every prompt). (2) The
  configurations of one ``wait`` share their transfer blocks: the residual after ``transfer = T`` blocks
  is extended by one block for ``T + 1``. (3) After the transfer blocks every token self-peeks, so the
  last position depends only on itself and BOS, and BOS's state (hence its key and value) is the same
  in every prompt and configuration: the remaining blocks run on the last position alone, with BOS's
  key and value supplied as a frozen key-value cache (``tail="last"``; ``tail="pair"`` runs ``[BOS,
  last]``). That is exact for learned absolute positions (already in the residual) and for rotary
  embeddings, whose last-position query and key are rotated to their true position ``n_pos-1``
  (``run_from(positions=...)``); other position schemes (ALiBi, local attention, ...) keep every
  position (``tail="full"``). Only the last position is unembedded. (4) With ``transfer = 0`` the answer depends only on
  the last token (its ablated state is a cached mean, a constant or an embedding) and BOS: one prompt per
  distinct last token is evaluated. (5) The plain-mean and zero baselines leave nothing of a prompt after
  block ``wait >= 0`` (every position but BOS holds the same per-position mean, or zero; BOS its own state):
  every prompt then has the same residual, hence the same answer logits, and one prompt is computed for all.
  (6) The transfers of one wait are evaluated together, block by block (:mod:`circuits.search.tails`): every
  answer row entering block ``s`` goes through it in one call, and the final rows are unembedded in chunks and
  reduced at once to the four readout numbers (:mod:`interventions.readout`); nothing else is unembedded.

Both backends run the fast method through ``interventions.adapt(model)``: ``run_from`` (only the blocks
after a given residual) and the adapter's ``capabilities`` choose the tail: ``tail="last"`` where the
adapter offers a frozen BOS key-value cache (``HookedTransformer``), else ``tail="pair"`` with the last
token placed at its true position (``TransformerBridge``: position ids given to the model's rotary
module), else ``tail="full"``; the numbers are the same.

``grid="full"`` evaluates every configuration; ``grid="auto"`` scans waits from the largest down,
each with transfers from 0 upward, stops a wait at its first sufficient transfer and stops descending
after the first wait that has one. Faithfulness need not be monotone in ``transfer``, but the rule only
needs (a) every configuration of the waits above the selected one (all evaluated, none sufficient) and
(b) the transfers below the selected one in its wait (all evaluated): the selection equals the full
grid's.
"""

from circuits.lazy import exports

__all__ = [
    "BatchedEvaluator", "NOT_EVALUATED", "Config", "ConfigResult", "Evaluator",
    "FastEvaluator", "make_evaluator",
    "NaiveEvaluator", "PerPrompt", "SEARCH", "SearchConfig", "SearchResult", "run_search", "check_config",
    "configurations", "load_summary", "scan",
    "search_af1", "select", "smallest_transfers", "two_position_exact", "write_outputs",
]

__getattr__ = exports(__name__, {
    "SEARCH": "circuits.search.analysis",
    "load_summary": "circuits.search.analysis",
    "run_search": "circuits.search.analysis",
    "search_af1": "circuits.search.analysis",
    "write_outputs": "circuits.search.analysis",
    "SearchConfig": "circuits.search.config",
    "BatchedEvaluator": "circuits.search.evaluators",
    "Evaluator": "circuits.search.evaluators",
    "FastEvaluator": "circuits.search.evaluators",
    "NaiveEvaluator": "circuits.search.evaluators",
    "PerPrompt": "circuits.search.evaluators",
    "make_evaluator": "circuits.search.evaluators",
    "two_position_exact": "circuits.search.evaluators",
    "ConfigResult": "circuits.search.results",
    "SearchResult": "circuits.search.results",
    "NOT_EVALUATED": "circuits.search.rule",
    "Config": "circuits.search.rule",
    "configurations": "circuits.search.rule",
    "scan": "circuits.search.rule",
    "select": "circuits.search.rule",
    "smallest_transfers": "circuits.search.rule",
    "check_config": "circuits.validation",
})
