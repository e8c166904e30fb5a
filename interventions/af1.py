"""The AF1 subgraph as a list of interventions (the composition the search evaluates)."""

from __future__ import annotations

from .ablation import CAMA, MeanAblation, ZeroAblation
from .base import Intervention
from .cache import MeanCache
from .peek import Peek
from .types import InterventionError
from .validation import check_choice
from .vocab import ABLATIONS, Ablation, config_problem


def af1_subgraph(
    n_layers: int,
    wait: int,
    transfer: int,
    cache: MeanCache | None = None,
    ablation: Ablation = "cama",
    n_last: int = 1,
) -> list[Intervention]:
    """Interventions of the AF1 configuration ``(wait, transfer)`` for a model of ``n_layers`` blocks.

    * ``wait`` (``L_wait``): index of the last waiting block, ``-1 .. n_layers-1``; the residual after
      block ``wait`` is ablated (``ablation``: CAMA, plain mean or zero); ``-1`` means no ablation.
    * ``transfer`` (``L_transfer``): number of blocks ``wait+1 .. wait+transfer`` in which the last token
      full-peeks while the other tokens self-peek; ``0 .. n_layers-1-wait``.
    * every later block: all tokens self-peek (BOS kept).

    ``n_last``: how many final positions count as "the last token" (default 1). An answer of ``k`` tokens,
    read under teacher forcing from the last ``k`` positions, makes each of them a last token: they
    full-peek in the transfer blocks and self-peek after them, like the single last token does (``k = 1`` is
    the AF1 subgraph itself).
    """
    problem = config_problem(n_layers, wait, transfer)
    if problem is not None:
        raise InterventionError(problem)
    check_choice("ablation", ablation, ABLATIONS)
    out: list[Intervention] = []
    if wait >= 0:
        if ablation == "cama":
            if cache is None:
                raise InterventionError("ablation='cama' needs a MeanCache")
            out.append(CAMA(cache, layer=wait))
        elif ablation == "mean":
            if cache is None:
                raise InterventionError("ablation='mean' needs a MeanCache")
            out.append(MeanAblation(cache, layer=wait))
        else:
            out.append(ZeroAblation(layer=wait))
    transfer_layers = tuple(range(wait + 1, wait + 1 + transfer))
    compute_layers = tuple(range(wait + 1 + transfer, n_layers))
    if transfer_layers:
        out.append(Peek(transfer_layers, mode="full", queries="last", n_last=n_last))
        out.append(Peek(transfer_layers, mode="self", queries="others", n_last=n_last))
    if compute_layers:
        out.append(Peek(compute_layers, mode="self", queries="all"))
    return out
