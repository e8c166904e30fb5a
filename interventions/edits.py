"""Which hook points of a model honour returned edits (checked once per model).

A backend may only *observe* an activation that its computation already consumed (TransformerLens 4.x
wrapping Hugging Face GPT-J: ``attn.hook_pattern``), so an edit returned there would silently do
nothing. :func:`edit_problems` runs a short probe (four tokens; per checked hook kind one forward pass
with a probe edit at every block, the user's hooks hidden) and reports the kinds that ignore edits
(the logits do not move, or the backend warns that an edit was discarded at some block). The adapter
wraps hooks at such points with :func:`refusing_edits`.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float

from .hooks import HookFn, HookPointLike, new_hook_level, pattern, resid_post, z
from .types import InterventionError, Model


def self_only(pattern_: Float[torch.Tensor, "*batch q k"]) -> Float[torch.Tensor, "*batch q k"]:
    """The attention pattern in which every query attends only to itself (same shape and dtype)."""
    n_q, n_k = pattern_.shape[-2:]
    return torch.eye(n_q, n_k, dtype=pattern_.dtype, device=pattern_.device).expand_as(pattern_).clone()


# hook kind -> (hook name of a block, a probe edit that must change the logits, what relies on it)
PROBES: dict[str, tuple[Callable[[int], str], Callable[[torch.Tensor], torch.Tensor], str]] = {
    "pattern": (pattern, self_only, "Peek (attention peeking, and the AF1 subgraph)"),
    "z": (z, torch.zeros_like, "HeadAblation"),
    # A feature permutation (a constant shift would vanish in the next LayerNorm).
    "resid_post": (resid_post, lambda r: r.roll(1, dims=-1), "CAMA, MeanAblation and ZeroAblation"),
}

_VERDICTS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def edit_kind(name: str) -> str | None:
    """The checked hook kind of hook name ``name`` (``"pattern"``, ``"z"``, ``"resid_post"``) or None."""
    for kind, (name_of, _, _) in PROBES.items():
        suffix = name_of(0).split(".", 2)[2]
        if name.startswith("blocks.") and name.endswith("." + suffix):
            return kind
    return None


def refusing_edits(fn: HookFn, reason: str) -> HookFn:
    """``fn`` wrapped so that returning an edit raises :class:`InterventionError` (``reason``)."""

    def hook(act: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor | None:
        out = fn(act, hook)
        if out is not None and out is not act:
            raise InterventionError(reason)
        return out

    return hook


@contextmanager
def without_user_hooks(ad: Any) -> Iterator[None]:
    """Hide the non-permanent hooks of every hook point of adapter ``ad`` (the user's), restoring them
    in order after."""
    saved: list[tuple[Any, OrderedDict]] = []
    try:
        # One hook point may be listed under several names (a bridge aliases e.g. hook_resid_post).
        points = {id(point): point for point in ad.hook_points().values()}
        for point in points.values():
            ids = {h.hook.id for h in getattr(point, "fwd_hooks", []) if not h.is_permanent}
            if ids:
                saved.append((point, OrderedDict(point._forward_hooks)))
                for hook_id in ids:
                    point._forward_hooks.pop(hook_id, None)
        yield
    finally:
        for point, hooks in saved:
            point._forward_hooks.clear()
            point._forward_hooks.update(hooks)


def edit_problems(ad: Any) -> dict[str, str]:
    """Which checked hook kinds of ``ad.model`` ignore returned edits, with the reason (memoised per
    model; ``ad`` is a :class:`~interventions.adapter.ModelAdapter`)."""
    try:
        return _VERDICTS[ad.model]
    except (KeyError, TypeError):
        pass
    model, info = ad.model, ad.info
    n = max(2, min(4, info.n_ctx))
    tokens = (torch.arange(n) % info.d_vocab).unsqueeze(0).to(ad.device())
    problems: dict[str, str] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), without_user_hooks(ad), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            base = model(tokens)
            tol = 1e-4 * (1.0 + float(base.abs().max()))
            for kind, (name_of, edit, users) in PROBES.items():
                names = [name_of(layer) for layer in range(info.n_layers) if ad.has_hook(name_of(layer))]
                if not names:
                    continue
                del caught[:]
                level = new_hook_level()  # raw hook points: the probe must bypass refusing_edits
                for name in names:
                    ad.hook_point(name).add_hook(lambda act, hook=None, e=edit: e(act), dir="fwd", level=level)
                try:
                    edited = model(tokens)
                finally:
                    ad.remove_hooks(names, level)
                warned = [str(w.message) for w in caught if "discard" in str(w.message).lower()]
                if warned or not float((edited - base).abs().max()) > tol:
                    problems[kind] = problem_message(model, names[0], users, warned)
    except Exception as err:  # noqa: BLE001 - the probe runs any model's forward pass; whatever stops it (unusual
        # inputs, a custom module), the interventions still work: a warning, not a failure
        warnings.warn(
            f"could not verify that edits at attn.hook_pattern / attn.hook_z / hook_resid_post reach the "
            f"logits of this {type(model).__name__} ({type(err).__name__}: {err}); check that an "
            f"intervention changes the logits before trusting it",
            RuntimeWarning,
            stacklevel=3,
        )
        problems = {}
    finally:
        model.train(was_training)
    try:
        _VERDICTS[model] = problems
    except TypeError:  # an object that cannot be weakly referenced: check again next time
        pass
    return problems


def problem_message(model: Model, name: str, users: str, warned: list[str]) -> str:
    """The one-paragraph error for edits at hook ``name`` that ``model`` ignores."""
    inner = getattr(model, "original_model", None)
    what = type(model).__name__ + (f" wrapping {type(inner).__name__}" if inner is not None else "")
    seen = f" (the backend warned: {warned[0]!r})" if warned else ""
    return (
        f"this {what} ignores edits returned at {name.replace('blocks.0.', 'blocks.{l}.')}: a probe edit "
        f"there did not reach the logits{seen}, so {users} would silently do nothing. The model's "
        f"backend only observes this activation after its own module consumed it. Use a model whose "
        f"attention TransformerLens computes itself: on TransformerLens 3.9 HookedTransformer; on 4.x "
        f"the weights converted with interventions.bridge_from_hooked_state (GPT-J-shaped models run "
        f"in the NeoX attention class), or a TransformerBridge architecture adapter that reimplements "
        f"this attention. Interventions at other hook points are unaffected."
    )
