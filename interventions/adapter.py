"""One small adapter between the interventions and a TransformerLens model.

Everything model-specific (hook lookup, hook registration, which module sees the token ids, shapes)
goes through :class:`ModelAdapter`, so that a new backend (TransformerLens 4.x ``TransformerBridge``)
is an addition here, not a rewrite of the interventions. Backends register with
:func:`register_backend`; :func:`adapt` picks the first whose predicate accepts the model.

Hook names used by the toolkit (shared by TransformerLens 3.9 ``HookedTransformer`` and 4.x
``TransformerBridge``) are built by the helpers :func:`resid_post`, :func:`pattern` and :func:`z`.

Edits are verified once per model: a backend may only *observe* an activation that its computation
already consumed (TransformerLens 4.x wrapping Hugging Face GPT-J: ``attn.hook_pattern``), so an edit
returned there would silently do nothing. The first :func:`adapt` of a model runs a short probe
(four tokens; per checked hook kind one forward pass with a probe edit at every block, the user's
hooks hidden) and remembers which kinds ignore edits (the logits do not move, or the backend warns
that an edit was discarded at some block); a hook
added through :meth:`ModelAdapter.add_hook` at such a point raises :class:`InterventionError` as soon
as it returns an edit. Read-only hooks (returning ``None``) stay allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from jaxtyping import Float, Int

from .types import InterventionError


def resid_pre(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid(layer: int) -> str:
    return f"blocks.{layer}.hook_resid_mid"


def resid_post(layer: int) -> str:
    """Residual stream after block ``layer`` (0-indexed)."""
    return f"blocks.{layer}.hook_resid_post"


def pattern(layer: int) -> str:
    """Post-softmax attention pattern of block ``layer``: ``[batch, n_heads, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def z(layer: int) -> str:
    """Per-head attention output before ``W_O``: ``[batch, pos, n_heads, d_head]`` (query heads)."""
    return f"blocks.{layer}.attn.hook_z"


def attn_out(layer: int) -> str:
    return f"blocks.{layer}.hook_attn_out"


def mlp_out(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"


@dataclass(frozen=True)
class ModelInfo:
    """Shapes of a model, as the interventions need them. All counts, 0-indexed where indices."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_vocab: int
    n_ctx: int
    parallel_attn_mlp: bool
    backend: str

    def check_layer(self, layer: int, what: str = "layer") -> None:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < self.n_layers:
            raise InterventionError(
                f"{what}={layer!r} is out of range: this model has {self.n_layers} blocks, "
                f"valid layers are 0..{self.n_layers - 1} (0-indexed)"
            )

    def check_head(self, layer: int, head: int) -> None:
        self.check_layer(layer, "head layer")
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < self.n_heads:
            raise InterventionError(
                f"head={head!r} of layer {layer} is out of range: valid query heads are "
                f"0..{self.n_heads - 1}"
            )

    def signature(self) -> dict[str, int]:
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "d_vocab": self.d_vocab,
        }


_levels = itertools.count(10_000)


def new_hook_level() -> int:
    """A fresh hook level: hooks added with it are removed together and touch no other hook."""
    return next(_levels)


HookFn = Callable[[torch.Tensor, Any], "torch.Tensor | None"]


class HookScope:
    """Forward hooks added through one adapter under one fresh level, removed together by
    :meth:`remove` (which :meth:`ModelAdapter.hooks` calls on exit, also after an exception)."""

    def __init__(self, adapter: "ModelAdapter"):
        self.adapter = adapter
        self.level = new_hook_level()
        self.names: list[str] = []

    def add(self, name: str, fn: HookFn) -> None:
        """Add ``fn(activation, hook)`` at hook point ``name`` (see :meth:`ModelAdapter.add_hook`)."""
        self.adapter.add_hook(name, fn, self.level)
        self.names.append(name)

    def remove(self) -> None:
        """Remove every hook this scope added (and nothing else); idempotent."""
        names, self.names = self.names, []
        self.adapter.remove_hooks(names, self.level)


class ModelAdapter:
    """Access to a TransformerLens ``HookedTransformer`` (3.x). Subclass for other backends.

    ``edit_problems`` maps a hook kind (``"pattern"``, ``"z"``, ``"resid_post"``) whose returned
    edits this model ignores to the reason; it is empty when every checked kind honours edits.
    """

    backend = "hooked"

    def __init__(self, model: Any):
        self.model = model
        cfg = model.cfg
        self.info = ModelInfo(
            n_layers=int(cfg.n_layers),
            n_heads=int(cfg.n_heads),
            n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads),
            d_model=int(cfg.d_model),
            d_head=int(cfg.d_head),
            d_vocab=int(cfg.d_vocab),
            n_ctx=int(cfg.n_ctx),
            parallel_attn_mlp=bool(getattr(cfg, "parallel_attn_mlp", False)),
            backend=self.backend,
        )
        self.edit_problems: dict[str, str] = _edit_problems(self)

    # --- hooks -------------------------------------------------------------------------------
    def hook_point(self, name: str) -> Any:
        try:
            return self.model.hook_dict[name]
        except KeyError:
            raise InterventionError(
                f"hook point {name!r} does not exist on this {self.backend} model "
                f"({self.info.n_layers} blocks)"
            ) from None

    def has_hook(self, name: str) -> bool:
        return name in self.model.hook_dict

    def hook_points(self) -> dict[str, Any]:
        """``{name: HookPoint}`` of every hook point of the model."""
        return self.model.hook_dict

    def add_hook(self, name: str, fn: Callable[[torch.Tensor, Any], torch.Tensor | None], level: int) -> None:
        """Add ``fn(activation, hook)`` as a forward hook at ``name``, tagged with ``level``.

        At a hook kind whose edits this model ignores (:attr:`edit_problems`), ``fn`` may still
        observe, but an edit it returns raises :class:`InterventionError` instead of being dropped.
        """
        point = self.hook_point(name)
        kind = edit_kind(name)
        if kind in self.edit_problems:
            fn = _refusing_edits(fn, self.edit_problems[kind])
        point.add_hook(fn, dir="fwd", level=level)

    def remove_hooks(self, names: list[str], level: int) -> None:
        for name in set(names):
            self.hook_point(name).remove_hooks("fwd", level=level)

    @contextmanager
    def hooks(self, fwd_hooks: "Iterable[tuple[str, HookFn]]" = ()) -> Iterator[HookScope]:
        """Scoped forward hooks, like TransformerLens's ``model.hooks(fwd_hooks=...)``: the hooks in
        ``fwd_hooks`` (``(hook name, fn)`` pairs) and any added to the yielded :class:`HookScope` live
        only inside the ``with`` block and are removed on exit, also after an exception. Other hooks on
        the model are untouched."""
        scope = HookScope(self)
        try:
            for name, fn in fwd_hooks:
                scope.add(name, fn)
            yield scope
        finally:
            scope.remove()

    def token_module(self) -> torch.nn.Module:
        """The module whose forward receives the token ids ``[batch, pos]`` of each forward pass."""
        return self.model.embed

    def register_forward_pre_hook(self, fn: Callable[..., Any]) -> Any:
        return self.model.register_forward_pre_hook(fn, with_kwargs=True)

    # --- identity and running ----------------------------------------------------------------
    def embedding_matrix(self) -> torch.Tensor:
        return self.model.W_E

    def fingerprint(self) -> str:
        """A short hash of (a sample of) the embedding matrix: tells two models of one shape apart."""
        w = self.embedding_matrix().detach()
        stride = max(1, w.shape[0] // 64)
        sample = w[::stride][:64].to(device="cpu", dtype=torch.float32).contiguous()
        return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]

    def run_to_resid(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run every block but skip the final norm and unembedding (saves the vocab projection)."""
        return self.model(tokens, stop_at_layer=self.info.n_layers)

    def embed(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """The residual entering block 0 (``blocks.0.hook_resid_pre``: token plus any absolute position
        embedding)."""
        return self.model(tokens, stop_at_layer=0)

    def run_from(
        self, resid: Float[torch.Tensor, "batch pos d_model"], start: int, stop: int | None = None
    ) -> torch.Tensor:
        """Run blocks ``start .. stop-1`` (0-indexed) on ``resid``, the residual entering block ``start``
        (``start = n_layers``: none). ``stop=None``: continue through the final norm and unembedding and
        return logits ``[batch, pos, d_vocab]``; otherwise return the residual entering block ``stop``
        (``[batch, pos, d_model]``, ``start < stop <= n_layers``). Hooks (and so interventions) in the
        blocks that run fire as in a full pass, ``blocks.{start}.hook_resid_pre`` included (it sees
        ``resid``); hooks of earlier blocks may fire on some backends but never change the result.
        Position ``p`` of ``resid`` is treated as position ``p``.
        """
        check_block_range(self.info.n_layers, start, stop)
        return self.model(resid, start_at_layer=start, stop_at_layer=stop)

    def device(self) -> torch.device:
        return self.embedding_matrix().device

    def dtype(self) -> torch.dtype:
        return self.embedding_matrix().dtype


# --- edit verification ---------------------------------------------------------------------------
def check_block_range(n_layers: int, start: int, stop: int | None) -> None:
    """``ValueError`` unless ``0 <= start <= n_layers`` and (``stop`` is None or ``start < stop <= n_layers``)."""
    if not 0 <= start <= n_layers:
        raise ValueError(f"start={start} is outside 0..{n_layers} (this model has {n_layers} blocks, 0-indexed)")
    if stop is not None and not start < stop <= n_layers:
        raise ValueError(f"stop={stop} must satisfy start < stop <= {n_layers} (start={start})")


def _self_only(pattern: torch.Tensor) -> torch.Tensor:
    n_q, n_k = pattern.shape[-2:]
    return torch.eye(n_q, n_k, dtype=pattern.dtype, device=pattern.device).expand_as(pattern).clone()


# hook kind -> (hook name of a block, a probe edit that must change the logits, what relies on it)
_PROBES: dict[str, tuple[Callable[[int], str], Callable[[torch.Tensor], torch.Tensor], str]] = {
    "pattern": (pattern, _self_only, "Peek (attention peeking, and the AF1 subgraph)"),
    "z": (z, torch.zeros_like, "HeadAblation"),
    # A feature permutation (a constant shift would vanish in the next LayerNorm).
    "resid_post": (resid_post, lambda r: r.roll(1, dims=-1), "CAMA, MeanAblation and ZeroAblation"),
}

_VERDICTS: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


def edit_kind(name: str) -> str | None:
    """The checked hook kind of hook name ``name`` (``"pattern"``, ``"z"``, ``"resid_post"``) or None."""
    for kind, (name_of, _, _) in _PROBES.items():
        suffix = name_of(0).split(".", 2)[2]
        if name.startswith("blocks.") and name.endswith("." + suffix):
            return kind
    return None


def _refusing_edits(fn: Callable[[torch.Tensor, Any], Any], reason: str) -> Callable[[torch.Tensor, Any], Any]:
    def hook(act: torch.Tensor, hook: Any = None) -> Any:
        out = fn(act, hook)
        if out is not None and out is not act:
            raise InterventionError(reason)
        return out

    return hook


@contextmanager
def _without_user_hooks(ad: "ModelAdapter") -> Iterator[None]:
    """Hide the non-permanent hooks of every hook point (the user's), restoring them in order after."""
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


def _edit_problems(ad: "ModelAdapter") -> dict[str, str]:
    """Which checked hook kinds of ``ad.model`` ignore returned edits (memoised per model)."""
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
        with torch.no_grad(), _without_user_hooks(ad), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            base = model(tokens)
            tol = 1e-4 * (1.0 + float(base.abs().max()))
            for kind, (name_of, edit, users) in _PROBES.items():
                names = [name_of(layer) for layer in range(info.n_layers) if ad.has_hook(name_of(layer))]
                if not names:
                    continue
                del caught[:]
                level = new_hook_level()
                for name in names:
                    ad.hook_point(name).add_hook(lambda act, hook=None, e=edit: e(act), dir="fwd", level=level)
                try:
                    edited = model(tokens)
                finally:
                    ad.remove_hooks(names, level)
                warned = [str(w.message) for w in caught if "discard" in str(w.message).lower()]
                if warned or not float((edited - base).abs().max()) > tol:
                    problems[kind] = _problem_message(model, names[0], users, warned)
    except Exception as err:  # a model the probe cannot run (unusual inputs): interventions still work
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


def _problem_message(model: Any, name: str, users: str, warned: list[str]) -> str:
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


_BACKENDS: list[tuple[Callable[[Any], bool], type[ModelAdapter]]] = []


BACKENDS = ("hooked", "bridge")
"""Backend names: ``"hooked"`` (``HookedTransformer``, TransformerLens 3.x), ``"bridge"`` (``TransformerBridge``)."""


def resolve_backend(backend: str | None) -> str:
    """``backend`` checked against :data:`BACKENDS`; ``None`` means ``"hooked"`` where this
    TransformerLens still has ``HookedTransformer`` (3.x) and ``"bridge"`` otherwise (4.x)."""
    if backend is None:
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:  # TransformerLens 4.x
            return "bridge"
        return "hooked"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not valid: choose 'hooked' or 'bridge'")
    return backend


def register_backend(predicate: Callable[[Any], bool], adapter_cls: type[ModelAdapter]) -> None:
    """Register an adapter class for models accepted by ``predicate`` (checked newest first)."""
    _BACKENDS.insert(0, (predicate, adapter_cls))


def _is_hooked_transformer(model: Any) -> bool:
    try:
        from transformer_lens import HookedTransformer
    except ImportError:  # TransformerLens 4.x removed it
        return False
    return isinstance(model, HookedTransformer)


register_backend(_is_hooked_transformer, ModelAdapter)


def adapt(model: Any) -> ModelAdapter:
    """The adapter for ``model``; raises ``TypeError`` for objects no backend accepts."""
    if isinstance(model, ModelAdapter):
        return model
    for predicate, cls in _BACKENDS:
        if predicate(model):
            return cls(model)
    raise TypeError(
        f"expected a TransformerLens model (HookedTransformer or TransformerBridge), got "
        f"{type(model).__name__}"
    )
