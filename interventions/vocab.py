"""The intervention layer's vocabulary, in one place: ablations of the residual stream, methods of head
ablation, backend names and the range rule of an AF1 configuration ``(wait, transfer)``.
:mod:`circuits.vocab` re-exports these and adds the analyses' own words. Torch-free: ``af1 --help`` reads it.
"""

from __future__ import annotations

from typing import Literal, get_args

Ablation = Literal["cama", "mean", "zero"]
"""How the residual after block ``wait`` is replaced: CAMA (conditional means), plain per-position mean or
zero."""
ABLATIONS: tuple[str, ...] = get_args(Ablation)

MEANS_ABLATIONS: tuple[str, ...] = ("cama", "mean")
"""The ablations that need a :class:`~interventions.MeanCache`."""

HeadMethod = Literal["zero", "mean"]
"""How a head's output ``hook_z`` is removed: zero, or its per-position mean over the fit prompts."""
HEAD_METHODS: tuple[str, ...] = get_args(HeadMethod)

Backend = Literal["hooked", "bridge", "nnsight"]
"""Model classes an intervention runs on: ``"hooked"`` (``HookedTransformer``, TransformerLens 3.x),
``"bridge"`` (``TransformerBridge``), ``"nnsight"`` (a Hugging Face model in nnsight; the ``nnsight`` extra)."""
BACKENDS: tuple[str, ...] = get_args(Backend)


def config_problem(n_layers: int, wait: object, transfer: object, *, min_transfer: int = 0) -> str | None:
    """What is wrong with the AF1 configuration ``(wait, transfer)`` of a model of ``n_layers`` blocks, or
    ``None``: ``wait`` (the 0-indexed last waiting block, ``-1`` = no ablation) in ``-1 .. n_layers-1-min_transfer``
    and ``transfer`` (the number of transfer blocks ``wait+1 .. wait+transfer``) in ``min_transfer ..
    n_layers-1-wait``. The one range rule: the search, pruning (``min_transfer=1``), the sweep and
    :func:`interventions.af1_subgraph` all ask it."""
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
