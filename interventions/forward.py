"""Applying interventions to a model: :func:`apply` (context manager) and :func:`run`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float, Int

from .adapter import ModelAdapter
from .base import ForwardContext, Intervention
from .cache import MeanCache
from .entries import UncoveredEntryError
from .readout import answer_positions, answer_readout
from .registry import adapt
from .types import InterventionError, InterventionNotAppliedError, Logits, Model, Tokens
from .validation import check_choice, check_tokens


def _as_list(interventions: Intervention | Iterable[Intervention]) -> list[Intervention]:
    items = [interventions] if isinstance(interventions, Intervention) else list(interventions)
    for item in items:
        if not isinstance(item, Intervention):
            raise InterventionError(f"expected Intervention objects, got {type(item).__name__}: {item!r}")
    return items


def checked(ad: ModelAdapter, interventions: Intervention | Iterable[Intervention]) -> list[Intervention]:
    """``interventions`` as a list, each validated against the model of ``ad`` (and its caches checked)."""
    items = _as_list(interventions)
    for item in items:
        item.validate(ad.info)
        for value in vars(item).values():
            if isinstance(value, MeanCache):
                value.check_model(ad)
    return items


@contextmanager
def tokens_as_text(ad: ModelAdapter) -> Iterator[None]:
    """Inside the block, an :class:`~interventions.entries.UncoveredEntryError` (raised by a hook, which holds
    no tokenizer) is re-raised naming its tokens as text with the model's tokenizer (where it has one)."""
    try:
        yield
    except UncoveredEntryError as err:
        raise err.with_tokenizer(getattr(ad.model, "tokenizer", None)) from None


@contextmanager
def apply(
    model: Model,
    interventions: Intervention | Sequence[Intervention],
    *,
    tokens: Tokens | None = None,
    check_fired: bool = True,
) -> Iterator[Model]:
    """Attach ``interventions`` to ``model`` for the duration of the ``with`` block.

    Inside, call the model as usual (``model(tokens)``); CAMA reads the token ids of each forward pass.
    Pass ``tokens`` only when the forward pass starts from a residual stream (``start_at_layer``).

    On exit every hook added here is removed (also after an exception) and no other hook is touched.
    With ``check_fired`` (default), if the model ran at least once and some intervention's hook never
    fired, :class:`InterventionNotAppliedError` is raised: such an intervention silently did nothing.
    """
    ad: ModelAdapter = adapt(model)
    items = checked(ad, interventions)
    if tokens is not None:
        tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)

    ctx = ForwardContext(tokens)
    fired: list[list[int]] = []  # per intervention: [times any of its hooks fired, hooks it added]
    handles = []

    def count(slot: list[int]) -> Callable[[], None]:
        def fired() -> None:
            slot[0] += 1

        return fired

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
                for name, body in ad.intervention_hooks(item, ctx):
                    scope.add(name, body, on_fire=count(slot))
                    slot[1] += 1
            with tokens_as_text(ad):
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
    model: Model,
    tokens: Tokens,
    interventions: Intervention | Sequence[Intervention],
    **forward_kwargs: Any,
) -> Logits:
    """Logits ``[batch, pos, d_vocab]`` of ``model(tokens)`` under ``interventions``. The token ids are put
    on the model's device first (``adapt(model).device()``): a ``TransformerBridge``, unlike
    ``HookedTransformer``, does not move them itself."""
    ad = adapt(model)
    tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab).to(ad.device())
    with apply(model, interventions):
        return model(tokens, **forward_kwargs)


def run_many(
    model: Model,
    runs: Sequence[tuple[Tokens, Intervention | Sequence[Intervention]]],
    *,
    logits: str = "last",
    answers: Sequence[Int[torch.Tensor, " batch *k"]] | None = None,
) -> list[Float[torch.Tensor, " batch *rest"]]:
    """Logits of several prompt batches, each under its own interventions: ``runs`` is a list of
    ``(tokens, interventions)``, every ``tokens`` ``[batch, pos]`` of one ``pos``. Per run, ``logits="last"``
    returns ``[batch, 1, d_vocab]`` (the last position), ``"all"`` every position, and ``"answer"`` the
    ``[batch, 4]`` :func:`~interventions.readout.answer_readout` of the last position for that run's
    ``answers`` (``[batch]`` token ids; all a search needs, 16 bytes per prompt from a remote backend).

    Where the adapter has the ``configs_per_pass`` capability (nnsight: one invoke per run in one trace,
    one request remotely) all runs share one forward pass; elsewhere each run is one :func:`run`. The
    numbers are the same either way."""
    check_choice("logits", logits, ("last", "all", "answer"))
    if logits == "answer" and (answers is None or len(answers) != len(runs)):
        raise InterventionError("run_many(logits='answer') needs answers: one [batch] tensor of token ids per run")
    ad = adapt(model)
    if not ad.capabilities.configs_per_pass:
        outs = []
        answer_ids: Sequence[torch.Tensor] = answers if answers is not None else ()  # checked above for "answer"
        for i, (tokens, interventions) in enumerate(runs):
            items = checked(ad, interventions)
            if items:
                out = run(model, tokens, items)
            else:  # on the model's device, as in run()
                out = model(check_tokens(tokens, d_vocab=ad.info.d_vocab).to(ad.device()))
            outs.append(answer_readout(answer_positions(out, answer_ids[i]), answer_ids[i]) if logits == "answer" else
                        out[:, -1:] if logits == "last" else out)
        return outs
    prepared = []
    for tokens, interventions in runs:
        tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)
        ctx = ForwardContext(tokens)
        hooks: dict[str, list[Any]] = {}
        for item in checked(ad, interventions):
            for name, body in ad.intervention_hooks(item, ctx):
                ad.hook_point(name)  # an unknown hook name raises here rather than being skipped
                hooks.setdefault(name, []).append(body)
        prepared.append((tokens, hooks))
    with tokens_as_text(ad):
        return ad.run_configs(prepared, logits, answers)
