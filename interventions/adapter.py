"""One small adapter between the interventions and a TransformerLens model.

Everything model-specific (hook lookup, hook registration, which module sees the token ids, shapes,
running blocks from a residual) goes through :class:`ModelAdapter`, so that a backend is an addition,
not a rewrite of the interventions. A backend is one module that subclasses :class:`ModelAdapter`; it is
registered with :func:`interventions.registry.register_backend`, and :func:`interventions.registry.adapt` picks the
first whose predicate accepts the model. The shipped backends live in :mod:`interventions.backends` (``hooked``:
``HookedTransformer``; ``bridge``: ``TransformerBridge``; ``nnsight``), registered by :mod:`interventions.registry`.

What a backend offers beyond hooks is declared in :attr:`ModelAdapter.capabilities`
(:class:`Capabilities`); callers such as the fast AF1 search ask for a capability, never for a
backend's name.

Edits are verified once per model (:mod:`interventions.edits`): a hook added through
:meth:`ModelAdapter.add_hook` at a hook kind whose edits the model ignores raises
:class:`InterventionError` as soon as it returns an edit. Read-only hooks stay allowed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from .edits import edit_kind, edit_problems, refusing_edits
from .hooks import (
    HookFn,
    HookPointLike,
    attn_mask,
    attn_out,
    counting,
    mlp_out,
    new_hook_level,
    pattern,
    resid_mid,
    resid_post,
    resid_pre,
    z,
)
from .types import InterventionError, JsonDict, Model
from .validation import check_choice
from .vocab import BACKENDS
from .weights import weights_sha256

__all__ = [
    "Capabilities", "HookFn", "HookScope", "ModelAdapter", "ModelInfo", "attn_mask", "attn_out",
    "check_block_range", "edit_kind", "mlp_out", "new_hook_level", "pattern",
    "resid_mid", "resid_post", "resid_pre", "resolve_backend", "z",
]


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


@dataclass(frozen=True)
class Capabilities:
    """What an adapter offers beyond hooks, for callers that take shortcuts (the fast AF1 search).

    * ``skips_blocks``: :meth:`ModelAdapter.run_from` executes only blocks ``start..stop-1`` (no work,
      no hook, in earlier blocks).
    * ``positions``: :meth:`ModelAdapter.run_from` honours ``positions`` (row ``p`` of the residual is
      treated as sitting at position ``positions[p]``, e.g. for rotary embeddings).
    * ``frozen_bos_kv``: :meth:`ModelAdapter.bos_key_values` and :meth:`ModelAdapter.run_last_from`
      run one position against the constant key and value of BOS.
    * ``configs_per_pass``: :meth:`ModelAdapter.run_configs` runs several prompt batches, each with its
      own interventions, in one forward pass (one request on a remote backend).
    * ``attention_masks``: attention takes a per-block mask of allowed keys
      (``blocks.{l}.attn.hook_attn_mask``), so :class:`~interventions.Peek` is applied as a mask
      rather than as an edit of the post-softmax pattern (:meth:`ModelAdapter.intervention_hooks`).
    * ``split_inputs``: the model computes one input per query head, key/value head and MLP, and ``W_O``
      is readable (:mod:`interventions.parts`): what an edge graph needs.
    """

    skips_blocks: bool = False
    positions: bool = False
    frozen_bos_kv: bool = False
    configs_per_pass: bool = False
    attention_masks: bool = False
    split_inputs: bool = False


class HookScope:
    """Forward hooks added through one adapter under one fresh level, removed together by
    :meth:`remove` (which :meth:`ModelAdapter.hooks` calls on exit, also after an exception)."""

    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter
        self.level = new_hook_level()
        self.names: list[str] = []

    def add(self, name: str, fn: HookFn, on_fire: Callable[[], None] | None = None) -> None:
        """Add ``fn(activation, hook)`` at hook point ``name`` (see :meth:`ModelAdapter.add_hook`)."""
        self.adapter.add_hook(name, fn, self.level, on_fire)
        self.names.append(name)

    def remove(self) -> None:
        """Remove every hook this scope added (and nothing else); idempotent."""
        names, self.names = self.names, []
        self.adapter.remove_hooks(names, self.level)


class ModelAdapter:
    """Access to a TransformerLens model with ``cfg``, ``hook_dict``, ``embed`` and ``W_E``: the hook
    interface every backend shares. Backends (:mod:`interventions.backends`) subclass it and implement
    running (:meth:`embed`, :meth:`run_from`, :meth:`run_to_resid`) and any :class:`Capabilities`.

    ``edit_problems`` maps a hook kind (``"pattern"``, ``"z"``, ``"resid_post"``) whose returned
    edits this model ignores to the reason; it is empty when every checked kind honours edits.
    """

    backend = "generic"
    capabilities = Capabilities()

    def __init__(self, model: Model):
        self.model = model
        self.hook_dict: dict[str, Any] = model.hook_dict  # a property on a bridge: read once
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
        self.edit_problems: dict[str, str] = self.check_edits()

    def check_edits(self) -> dict[str, str]:
        """:attr:`edit_problems`, found by the once-per-model probe (:func:`interventions.edits.edit_problems`)."""
        return edit_problems(self)

    # --- hooks -------------------------------------------------------------------------------
    def hook_point(self, name: str) -> Any:
        try:
            return self.hook_dict[name]
        except KeyError:
            raise InterventionError(
                f"hook point {name!r} does not exist on this {self.backend} model "
                f"({self.info.n_layers} blocks): check the name against adapt(model).hook_points()"
            ) from None

    def has_hook(self, name: str) -> bool:
        return name in self.hook_dict

    def hook_points(self) -> dict[str, Any]:
        """``{name: HookPoint}`` of every hook point of the model."""
        return self.hook_dict

    def add_hook(self, name: str, fn: HookFn, level: int, on_fire: Callable[[], None] | None = None) -> None:
        """Add ``fn(activation, hook)`` as a forward hook at ``name``, tagged with ``level``; ``on_fire()``
        (if given) is called once each time the hook runs.

        At a hook kind whose edits this model ignores (:attr:`edit_problems`), ``fn`` may still
        observe, but an edit it returns raises :class:`InterventionError` instead of being dropped.
        """
        point = self.hook_point(name)
        kind = edit_kind(name)
        if kind in self.edit_problems:
            fn = refusing_edits(fn, self.edit_problems[kind])
        self.attach(point, fn, level, on_fire)

    def attach(self, point: Any, fn: HookFn, level: int, on_fire: Callable[[], None] | None) -> None:
        """Put hook ``fn`` on hook point object ``point`` (what :meth:`add_hook` does after its checks)."""
        point.add_hook(counting(fn, on_fire), dir="fwd", level=level)

    def remove_hooks(self, names: list[str], level: int) -> None:
        for name in set(names):
            self.hook_point(name).remove_hooks("fwd", level=level)

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[str, HookFn]] = ()) -> Iterator[HookScope]:
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

    def intervention_hooks(self, item: Any, ctx: Any) -> list[tuple[str, HookFn]]:
        """The ``(hook name, body)`` pairs that apply intervention ``item`` on this model: its attention
        mask form (:meth:`~interventions.base.Intervention.mask_hooks`) where the adapter has the
        ``attention_masks`` capability and the intervention has one, else its hooks."""
        if self.capabilities.attention_masks:
            masks = item.mask_hooks(self.info)
            if masks is not None:
                return masks
        return item.hooks(ctx, self.info)

    def activations(self, tokens: Int[torch.Tensor, "batch pos"], names: Sequence[str],
                    summed: Sequence[str] = ()) -> dict[str, torch.Tensor]:
        """``{hook name: activation}`` of one forward pass over ``tokens`` for ``names``, and the activation
        summed over the batch (dimension 0) for ``summed`` (after any hooks at those points; the pass ends
        after the last block). Hooks of the model fire as in any pass."""
        seen: dict[str, torch.Tensor] = {}

        def keep(name: str, total: bool) -> HookFn:
            def store(act: torch.Tensor, hook: HookPointLike | None = None) -> None:
                seen[name] = act.detach().double().sum(0) if total else act.detach()

            return store

        with self.hooks([(n, keep(n, False)) for n in names] + [(n, keep(n, True)) for n in summed]):
            self.run_to_resid(tokens)
        return seen

    def run_configs(self, runs: Sequence[tuple[Int[torch.Tensor, "batch pos"], dict[str, list[HookFn]]]],
                    logits: str = "last", answers: Sequence[Int[torch.Tensor, " batch *k"]] | None = None,
                    ) -> list[Float[torch.Tensor, " batch *rest"]]:
        """Logits of several prompt batches in one forward pass, each with its own hooks (``(tokens, {hook
        name: functions})``; every batch of one length). ``logits``: ``"last"`` (``[batch, 1, d_vocab]``),
        ``"all"`` positions, or ``"answer"`` (``[batch, 4]`` readout for each run's ``answers``, see
        :mod:`interventions.readout`). Capability ``configs_per_pass``."""
        raise NotImplementedError(self.missing("run_configs", "configs_per_pass"))

    def token_module(self) -> torch.nn.Module:
        """The module whose forward receives the token ids ``[batch, pos]`` of each forward pass."""
        return self.model.embed

    def register_forward_pre_hook(self, fn: Callable[..., Any]) -> Any:
        return self.model.register_forward_pre_hook(fn, with_kwargs=True)

    # --- identity ----------------------------------------------------------------------------
    def embedding_matrix(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        return self.model.W_E

    def fingerprint(self) -> str:
        """A short hash of (a sample of) the embedding matrix: tells two models of one shape apart."""
        w = self.embedding_matrix().detach()
        stride = max(1, w.shape[0] // 64)
        sample = w[::stride][:64].to(device="cpu", dtype=torch.float32).contiguous()
        return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]

    def weights_module(self) -> torch.nn.Module | None:
        """The torch module holding every weight of the model (``None`` where the weights are not here)."""
        if isinstance(self.model, torch.nn.Module):
            return self.model
        hf = getattr(self.model, "hf", None)
        return hf if isinstance(hf, torch.nn.Module) else None

    def weights_sha256(self) -> str:
        """SHA-256 over every tensor of the model's state dict (names, dtypes, shapes and bytes): two models
        that differ in any weight differ here. Computed once per loaded model and kept while no tensor of it
        is replaced or changed in place (:func:`interventions.weights.weights_sha256`). Where the weights are not
        here (a remote model), the :meth:`fingerprint`."""
        module = self.weights_module()
        digest = weights_sha256(module) if module is not None else None
        return digest if digest is not None else self.fingerprint()

    def model_identity(self) -> JsonDict:
        """What a run identity records of the model: its shapes, :meth:`fingerprint` and
        :meth:`weights_sha256`."""
        return {**self.info.signature(), "fingerprint": self.fingerprint(), "weights_sha256": self.weights_sha256()}

    def device(self) -> torch.device:
        return self.embedding_matrix().device

    def dtype(self) -> torch.dtype:
        return self.embedding_matrix().dtype

    # --- running (implemented by each backend) -----------------------------------------------
    def run_to_resid(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """Run every block but skip the final norm and unembedding (saves the vocab projection)."""
        raise NotImplementedError(self.missing("run_to_resid"))

    def embed(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """The residual entering block 0 (``blocks.0.hook_resid_pre``: token plus any absolute position
        embedding)."""
        raise NotImplementedError(self.missing("embed"))

    def run_from(
        self,
        resid: Float[torch.Tensor, "batch pos d_model"],
        start: int,
        stop: int | None = None,
        positions: Int[torch.Tensor, " pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_out"]:
        """Run blocks ``start .. stop-1`` (0-indexed) on ``resid``, the residual entering block ``start``
        (``start = n_layers``: none). ``stop=None``: continue through the final norm and unembedding and
        return logits ``[batch, pos, d_vocab]``; otherwise return the residual entering block ``stop``
        (``[batch, pos, d_model]``, ``start < stop <= n_layers``). Hooks (and so interventions) in the
        blocks that run fire as in a full pass, ``blocks.{start}.hook_resid_pre`` included (it sees
        ``resid``); without :attr:`Capabilities.skips_blocks` hooks of earlier blocks may fire too, but
        never change the result. Row ``p`` of ``resid`` sits at position ``positions[p]`` (token
        positions, 0 = BOS; default ``p``); only adapters with :attr:`Capabilities.positions` accept
        ``positions``. Absolute position embeddings are part of ``resid`` already and unaffected.
        """
        check_block_range(self.info.n_layers, start, stop)
        if positions is not None:
            if not self.capabilities.positions:
                raise NotImplementedError(self.missing("run_from(positions=...)", "positions"))
            if positions.shape != (resid.shape[1],):
                raise InterventionError(f"positions has shape {tuple(positions.shape)}: give one position per row "
                                        f"of resid, shape ({resid.shape[1]},)")
        return self.forward_from(resid, start, stop, positions)

    def forward_from(self, resid: Float[torch.Tensor, "batch pos d_model"], start: int, stop: int | None,
                     positions: Int[torch.Tensor, " pos"] | None) -> Float[torch.Tensor, "batch pos d_out"]:
        """:meth:`run_from` after its arguments were checked: what a backend implements."""
        raise NotImplementedError(self.missing("run_from"))

    def bos_key_values(self, bos: Int[torch.Tensor, "1 1"]) -> Any:
        """An opaque per-block record of the key and value of the single token ``bos`` at position 0,
        for :meth:`run_last_from` (capability ``frozen_bos_kv``). Runs one forward pass over ``bos``;
        hooks fire as in any pass."""
        raise NotImplementedError(self.missing("bos_key_values", "frozen_bos_kv"))

    def run_last_from(
        self, resid: Float[torch.Tensor, "batch 1 d_model"], start: int, bos_kv: Any, position: int,
        stop: int | None = None,
    ) -> Float[torch.Tensor, "batch 1 d_out"]:
        """Logits of one token at token position ``position`` (>= 1) attending to itself and to BOS,
        whose keys and values are ``bos_kv`` (from :meth:`bos_key_values`): blocks ``start..n_layers-1``
        (0-indexed) on ``resid``, the token's residual entering block ``start``, then the final norm and
        unembedding. With ``stop``: blocks ``start..stop-1`` only, returning the residual entering block
        ``stop`` (``[batch, 1, d_model]``). Hooks of those blocks fire for the token's row (the pattern has
        2 key positions: BOS, then the token). Capability ``frozen_bos_kv``."""
        raise NotImplementedError(self.missing("run_last_from", "frozen_bos_kv"))

    def unembed(self, resid: Float[torch.Tensor, "rows d_model"]) -> Float[torch.Tensor, "rows d_vocab"]:
        """Logits of residual rows after the last block (``[rows, d_model]``, any rows of any prompts): the
        final norm and the unembedding, as the end of a forward pass applies them (their hooks fire).
        Row by row the same as :meth:`run_from` with ``start = n_layers``; backends may do it faster."""
        return self.run_from(resid[:, None], self.info.n_layers)[:, 0]

    def missing(self, method: str, capability: str | None = None) -> str:
        """The error message for a method this backend does not implement."""
        what = f" (capability {capability})" if capability else ""
        return (f"{type(self).__name__} (backend {self.backend!r}) does not implement {method}{what}: check "
                f"adapt(model).capabilities first, or implement it in the backend's adapter")


def check_block_range(n_layers: int, start: int, stop: int | None) -> None:
    """:class:`InterventionError` unless ``0 <= start <= n_layers`` and (``stop`` is None or ``start < stop <=
    n_layers``)."""
    if not 0 <= start <= n_layers:
        raise InterventionError(f"start={start} is outside 0..{n_layers} (this model has {n_layers} blocks, 0-indexed)")
    if stop is not None and not start < stop <= n_layers:
        raise InterventionError(f"stop={stop} must satisfy start < stop <= {n_layers} (start={start})")


# --- the default backend -------------------------------------------------------------------------------
def resolve_backend(backend: str | None) -> str:
    """``backend`` checked against :data:`BACKENDS`; ``None`` means ``"hooked"`` where this
    TransformerLens still has ``HookedTransformer`` (3.x) and ``"bridge"`` otherwise (4.x)."""
    if backend is None:
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:  # TransformerLens 4.x
            return "bridge"
        return "hooked"
    return check_choice("backend", backend, BACKENDS)
