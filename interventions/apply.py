"""Applying interventions to a model: :func:`apply` (context manager) and :func:`run`."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Sequence

import torch

from .adapter import ModelAdapter, adapt
from .base import ForwardContext, Intervention
from .cache import MeanCache
from .types import InterventionError, InterventionNotAppliedError, Logits, Tokens
from .validation import check_tokens


def _as_list(interventions: Intervention | Iterable[Intervention]) -> list[Intervention]:
    items = [interventions] if isinstance(interventions, Intervention) else list(interventions)
    for item in items:
        if not isinstance(item, Intervention):
            raise InterventionError(f"expected Intervention objects, got {type(item).__name__}: {item!r}")
    return items


@contextmanager
def apply(
    model: Any,
    interventions: Intervention | Sequence[Intervention],
    *,
    tokens: Tokens | None = None,
    check_fired: bool = True,
) -> Iterator[Any]:
    """Attach ``interventions`` to ``model`` for the duration of the ``with`` block.

    Inside, call the model as usual (``model(tokens)``); CAMA reads the token ids of each forward pass.
    Pass ``tokens`` only when the forward pass starts from a residual stream (``start_at_layer``).

    On exit every hook added here is removed (also after an exception) and no other hook is touched.
    With ``check_fired`` (default), if the model ran at least once and some intervention's hook never
    fired, :class:`InterventionNotAppliedError` is raised: such an intervention silently did nothing.
    """
    ad: ModelAdapter = adapt(model)
    items = _as_list(interventions)
    for item in items:
        item.validate(ad.info)
        for value in vars(item).values():
            if isinstance(value, MeanCache):
                value.check_model(ad)
    if tokens is not None:
        tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)

    ctx = ForwardContext(tokens)
    fired: list[list[int]] = []  # per intervention: [times any of its hooks fired, hooks it added]
    handles = []

    def count(body: Any, slot: list[int]) -> Any:
        def hook(act: torch.Tensor, hook: Any = None) -> torch.Tensor | None:
            slot[0] += 1
            return body(act, hook)

        return hook

    def on_forward(module: Any, args: tuple, kwargs: dict) -> None:
        ctx.n_forwards += 1
        first = args[0] if args else kwargs.get("input")
        if ctx.fixed_tokens is not None:
            ctx.tokens = ctx.fixed_tokens
        elif isinstance(first, torch.Tensor) and not first.is_floating_point():
            ctx.tokens = first
        else:
            ctx.tokens = kwargs.get("tokens")

    def on_embed(module: Any, args: tuple, kwargs: dict) -> None:
        first = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(first, torch.Tensor) and not first.is_floating_point():
            ctx.tokens = first

    try:
        with ad.hooks() as scope:
            handles.append(ad.register_forward_pre_hook(on_forward))
            if any(item.uses_tokens for item in items):
                handles.append(ad.token_module().register_forward_pre_hook(on_embed, with_kwargs=True))
            for item in items:
                slot = [0, 0]
                fired.append(slot)
                for name, body in item.hooks(ctx, ad.info):
                    scope.add(name, count(body, slot))
                    slot[1] += 1
            yield model
    finally:
        for handle in handles:
            handle.remove()

    if check_fired and ctx.n_forwards > 0:
        silent = [repr(item) for item, (n_fired, n_hooks) in zip(items, fired) if n_hooks and not n_fired]
        if silent:
            raise InterventionNotAppliedError(
                f"{len(silent)} intervention(s) never fired during {ctx.n_forwards} forward pass(es) and "
                f"silently did nothing: {'; '.join(silent)}. (A forward pass that stops early, e.g. "
                f"stop_at_layer, skips later hooks: pass check_fired=False if that is intended.)"
            )


def run(
    model: Any,
    tokens: Tokens,
    interventions: Intervention | Sequence[Intervention],
    **forward_kwargs: Any,
) -> Logits:
    """Logits ``[batch, pos, d_vocab]`` of ``model(tokens)`` under ``interventions``."""
    ad = adapt(model)
    tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)
    with apply(model, interventions):
        return model(tokens, **forward_kwargs)
