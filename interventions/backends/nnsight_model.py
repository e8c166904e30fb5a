"""The model object of the nnsight backend: a Hugging Face causal LM in an nnsight model, with the
TransformerLens surface the toolkit reads (``cfg``, ``tokenizer``, ``to_tokens``, ``hook_dict``,
``model(tokens) -> logits``).

Every forward pass is one nnsight trace (:mod:`.nnsight_trace`): locally, or on NDIF with
``remote=True`` (``"local"``: nnsight's serverless dry run, which serialises the request, rebuilds it
with the project's modules hidden and runs it here). Hooks added at the emulated hook points
(:class:`HookPoint`) run inside the trace; what a remote run returns is only what the trace saves, so
the backend reports which hooks ran from the trace's own record (``on_fire`` callbacks run here,
after the trace). :attr:`NNsightModel.usage` counts requests (traces) and tokens.

nnsight is imported only when a model is built (:func:`require_nnsight`).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from ..hooks import HookFn
from ..types import InterventionError, Model, Tokenizer
from .nnsight_layout import config_of, layout_of
from .nnsight_split import SplitBlock, head_out_weights, split_blocks
from .nnsight_trace import POINT_KINDS, Invoke, run_trace

INSTALL_HINT = "pip install 'af1-circuits[nnsight]'"


class MissingPackageError(InterventionError, ImportError):
    """An optional package is not installed (an ``ImportError``, and a ``ValueError`` like every expected
    failure, so the command line prints one line)."""


def require_nnsight() -> Any:
    """The ``nnsight`` module; ``ImportError`` with the install command when it is missing."""
    try:
        import nnsight
    except ImportError:
        raise MissingPackageError(f"the nnsight backend needs the nnsight package: {INSTALL_HINT}") from None
    return nnsight


class HookHandle:
    """What :func:`interventions.edits.without_user_hooks` reads of a hook (``hook.id``, ``is_permanent``)."""

    def __init__(self, hook_id: int, is_permanent: bool):
        self.hook = self
        self.id = hook_id
        self.is_permanent = is_permanent


class HookPoint:
    """An emulated hook point: the functions added at ``name`` (by level), run inside each trace."""

    def __init__(self, name: str):
        self.name = name
        self._forward_hooks: OrderedDict[int, HookFn] = OrderedDict()
        self.levels: dict[int, int | None] = {}
        self.on_fire: dict[int, Callable[[], None]] = {}
        self.permanent: set[int] = set()
        self.next_id = 0

    def add_hook(self, fn: HookFn, dir: str = "fwd", level: int | None = None,
                 on_fire: Callable[[], None] | None = None, is_permanent: bool = False) -> None:
        """Add forward hook ``fn`` with ``level``; ``on_fire()`` runs here after each trace in which it ran.
        A permanent hook (e.g. a planted mask) is removed only by ``remove_hooks(including_permanent=True)``."""
        if dir != "fwd":
            raise InterventionError(f"the nnsight backend has forward hooks only, not dir={dir!r}")
        self.next_id += 1
        self._forward_hooks[self.next_id] = fn
        self.levels[self.next_id] = level
        if is_permanent:
            self.permanent.add(self.next_id)
        if on_fire is not None:
            self.on_fire[self.next_id] = on_fire

    def remove_hooks(self, dir: str = "fwd", level: int | None = None, including_permanent: bool = False) -> None:
        """Remove the hooks added with ``level`` (every hook when ``level`` is None), permanent ones only
        with ``including_permanent``."""
        for hook_id in [k for k, v in self.levels.items() if (level is None or v == level)
                        and (including_permanent or k not in self.permanent)]:
            self._forward_hooks.pop(hook_id, None)
            self.levels.pop(hook_id, None)
            self.on_fire.pop(hook_id, None)

    @property
    def fwd_hooks(self) -> list[HookHandle]:
        return [HookHandle(k, k in self.permanent) for k in self._forward_hooks]

    def functions(self) -> list[HookFn]:
        """The hooks present now, in the order they were added (the order they run)."""
        return list(self._forward_hooks.values())

    def fired(self) -> None:
        """Run the ``on_fire`` callbacks of the hooks present now (after a trace in which they ran)."""
        for hook_id, callback in list(self.on_fire.items()):
            if hook_id in self._forward_hooks:
                callback()


@dataclass
class Usage:
    """Requests (traces, one forward pass each) and tokens (prompt tokens over every invoke) so far."""

    requests: int = 0
    invokes: int = 0
    tokens: int = 0


def point_names(n_layers: int, parallel: bool) -> list[str]:
    """Every emulated hook name of a model with ``n_layers`` blocks (0-indexed), in forward order
    (``hook_resid_mid`` only for sequential blocks, as on TransformerLens)."""
    kinds = [k for k in POINT_KINDS if not (parallel and k in ("hook_resid_mid", "hook_mlp_in"))]
    return [f"blocks.{l}.{kind}" for l in range(n_layers) for kind in kinds]


class NNsightModel(torch.nn.Module):
    """A Hugging Face causal LM wrapped in nnsight, read like a TransformerLens model.

    ``lm``: the nnsight model; ``hf``: the Hugging Face module (the meta-device skeleton when
    ``remote`` is set); ``cfg``: shapes under TransformerLens names
    (:class:`~.nnsight_layout.NNsightConfig`); ``remote``: ``False`` (run here), ``True`` (NDIF, the
    API key from the ``NDIF_API_KEY`` environment variable) or ``"local"`` (nnsight's serverless dry run).
    """

    def __init__(self, lm: Model, name: str, tokenizer: Tokenizer, remote: bool | str = False):
        super().__init__()
        self.hf = lm._module  # the wrapped Hugging Face module: nnsight 0.8 has no public accessor
        object.__setattr__(self, "lm", lm)
        self.layout = layout_of(self.hf)
        self.cfg = config_of(self.hf.config, name, tokenizer)
        param = next(self.hf.parameters())
        self.cfg.device, self.cfg.dtype = param.device, param.dtype
        self.tokenizer = tokenizer
        self.remote = remote
        names = point_names(self.cfg.n_layers, self.layout.mid_norm is None)
        self.hook_dict: dict[str, HookPoint] = {n: HookPoint(n) for n in names}
        self.usage = Usage()
        self.split_cache: list[SplitBlock] | None = None

    # --- TransformerLens surface ------------------------------------------------------------
    @property
    def ln_final(self) -> torch.nn.Module | None:
        """The final norm module (``None`` if the model has none), run here (needs local weights)."""
        return None if self.layout.final_norm is None else self.local_module(self.layout.final_norm)

    @property
    def unembed(self) -> torch.nn.Module:
        """The unembedding (``lm_head``, with any bias): residual ``[..., d_model]`` to logits, run here."""
        return self.local_module(self.layout.head)

    def local_module(self, path: str) -> torch.nn.Module:
        """The Hugging Face module at ``path``, to run in this process; ``ValueError`` for a remote model."""
        module = self.hf.get_submodule(path)
        if any(p.device.type == "meta" for p in module.parameters()):
            raise InterventionError(f"{path} of a remote model has no weights here: decoding residual states "
                                    "(af1 lens) "
                                    f"runs locally; run it without --remote")
        return module

    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        """The token embedding matrix ``[d_vocab, d_model]`` (on the meta device when remote)."""
        return self.hf.get_input_embeddings().weight

    def to_tokens(self, text: str | Sequence[str], prepend_bos: bool | None = None,
                  **_: Any) -> Int[torch.Tensor, "batch pos"]:
        """Token ids ``[batch, pos]`` of ``text`` (one string or a list of one token length), with BOS (the
        EOS token where the tokenizer has no BOS) at position 0 when ``prepend_bos`` (default:
        ``cfg.default_prepend_bos``)."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        if prepend_bos if prepend_bos is not None else self.cfg.default_prepend_bos:
            bos = (self.tokenizer.bos_token_id if self.tokenizer.bos_token_id is not None
                   else self.tokenizer.eos_token_id)
            ids = [[bos] + list(row) for row in ids]
        if len({len(row) for row in ids}) != 1:
            raise InterventionError("to_tokens got texts of different token lengths: tokenize one layout at a time")
        return torch.tensor(ids, dtype=torch.long)

    def to_string(self, tokens: Int[torch.Tensor, "*batch pos"] | Sequence[int]) -> str | list[str]:
        """Decoded text of ``tokens`` (one string per row of a ``[batch, pos]`` tensor)."""
        t = torch.as_tensor(tokens)
        if t.ndim == 2:
            return [str(self.tokenizer.decode(row.tolist())) for row in t]
        return self.tokenizer.decode(t.tolist())

    def to_str_tokens(self, text: str | Int[torch.Tensor, "*one pos"], prepend_bos: bool | None = None) -> list[str]:
        """The text of each token of ``text`` (a string, or token ids of one prompt)."""
        ids = self.to_tokens(text, prepend_bos)[0] if isinstance(text, str) else torch.as_tensor(text).flatten()
        return [str(self.tokenizer.decode([int(t)])) for t in ids]

    @property
    def W_O(self) -> Float[torch.Tensor, "n_layers n_heads d_head d_model"]:
        """Every block's attention output projection per head, as TransformerLens holds it (needs local weights)."""
        return head_out_weights(self.local_module(self.layout.blocks), self.layout, self.cfg)

    # --- split inputs (TransformerLens's use_split_qkv_input and use_hook_mlp_in) -----------
    def set_use_split_qkv_input(self, use: bool) -> None:
        """Emulate ``hook_q_input``/``hook_k_input``/``hook_v_input`` (and ``hook_mlp_in``) from now on
        (:mod:`.nnsight_split`); refused, in one line, for a remote model or blocks the emulation does not cover."""
        self.cfg.use_split_qkv_input = self.switch_split(use, self.cfg.use_hook_mlp_in)

    def set_use_hook_mlp_in(self, use: bool) -> None:
        """Emulate ``hook_mlp_in`` (the MLP's own input) from now on (as :meth:`set_use_split_qkv_input`)."""
        self.cfg.use_hook_mlp_in = self.switch_split(use, self.cfg.use_split_qkv_input)

    def switch_split(self, use: bool, other: bool) -> bool:
        """Build every block's :class:`~.nnsight_split.SplitBlock` when split inputs are switched on (views of the
        weights as they are now, refusals included); drop them when this switch goes off and the ``other`` is off
        too. Returns ``use``."""
        if use and self.remote:
            raise InterventionError("split query/key/value inputs need the weights here: run without --remote")
        if use and self.split_cache is None:
            self.split_cache = split_blocks(self.local_module(self.layout.blocks), self.layout, self.cfg)
        if not use and not other:
            self.split_cache = None
        return bool(use)

    def split(self) -> list[SplitBlock] | None:
        """What a trace emulates split inputs with: ``None`` unless switched on."""
        return self.split_cache if self.cfg.use_split_qkv_input or self.cfg.use_hook_mlp_in else None

    # --- running ----------------------------------------------------------------------------
    def forward(self, tokens: Int[torch.Tensor, "batch pos"], **_: Any) -> Float[torch.Tensor, "batch pos d_vocab"]:
        """Logits ``[batch, pos, d_vocab]`` of ``tokens`` with the hooks added at :attr:`hook_dict`."""
        return self.run([Invoke(tokens)])[0]["logits"]

    def run(self, invokes: list[Invoke]) -> list[dict[str, Any]]:
        """Run ``invokes`` in one trace (see :func:`~.nnsight_trace.run_trace`). Each invoke's own hooks run
        before the hooks added at :attr:`hook_dict` (which apply to every invoke)."""
        if len({int(inv.tokens.shape[1]) for inv in invokes}) != 1:
            raise InterventionError("the invokes of one trace need prompts of one token length (no padding): "
                                    "group prompts by layout")
        device = torch.device("cpu") if self.remote else self.cfg.device
        everywhere = {name: p.functions() for name, p in self.hook_dict.items() if p.functions()}
        for inv in invokes:
            inv.tokens = inv.tokens.to(device)
            if inv.answers is not None:
                inv.answers = inv.answers.to(device)
            for name, fns in everywhere.items():
                inv.hooks[name] = list(inv.hooks.get(name, [])) + fns
        kwargs: dict[str, Any] = {"use_cache": False}
        if self.remote:
            kwargs["remote"] = self.remote
            ship_by_value()
            if self.remote is True:
                use_environment_key()
        out = run_trace(self.lm, self.layout, self.cfg.n_layers, self.cfg.n_heads, invokes, kwargs, self.split())
        self.usage.requests += 1
        self.usage.invokes += len(invokes)
        self.usage.tokens += sum(int(inv.tokens.numel()) for inv in invokes)
        for res in out:
            for name in set(res["visited"]):
                if name in self.hook_dict:
                    self.hook_dict[name].fired()
        return out


def check_remote(remote: bool | str) -> None:
    """``ValueError`` unless a remote run can start: ``NDIF_API_KEY`` must be set (it is read from the
    environment only, never written anywhere); ``"local"`` needs nothing."""
    if remote is True and not os.environ.get("NDIF_API_KEY"):
        raise InterventionError("--remote needs an NDIF API key in the environment: export NDIF_API_KEY=... "
                                "(from https://login.ndif.us; it is never written to a file)")


def ship_by_value() -> None:
    """Have nnsight send the ``interventions`` package's code with remote requests (by value): NDIF does not
    have it installed, and the hooks and the trace body are defined in it."""
    import interventions

    require_nnsight().register(interventions)


def use_environment_key() -> None:
    """Give nnsight the API key of the ``NDIF_API_KEY`` environment variable (in memory; a key saved in
    nnsight's own config file is not used). ``ValueError`` when the variable is not set."""
    check_remote(True)
    require_nnsight().CONFIG.API.APIKEY = os.environ["NDIF_API_KEY"]


def wrap(hf_model: Any, tokenizer: Tokenizer, name: str, remote: bool | str = False) -> NNsightModel:
    """Wrap the Hugging Face causal LM ``hf_model`` (with ``tokenizer``) in nnsight as an
    :class:`NNsightModel` called ``name``, in eval mode."""
    nnsight = require_nnsight()
    hf_model.eval()
    lm = nnsight.TransformersModel(hf_model, tokenizer=tokenizer, task="text-generation")
    return NNsightModel(lm, name, tokenizer, remote=remote).eval()


def from_pretrained(name: str, device: str = "cpu", dtype: torch.dtype | None = None,
                    remote: bool | str = False, device_map: str | None = None,
                    max_memory: dict[int | str, str] | None = None) -> NNsightModel:
    """The pretrained causal LM ``name`` (a Hugging Face repository, or a local folder) as an
    :class:`NNsightModel`. ``remote=True``: only the config and tokenizer are read (the weights stay on
    NDIF, the local model is a meta-device skeleton); otherwise the weights are loaded on ``device``
    in ``dtype`` (default float32) with SDPA attention, on ``device`` or spread by ``device_map`` (a
    Hugging Face device map such as ``"auto"``, with ``max_memory`` per device)."""
    nnsight = require_nnsight()
    check_remote(remote)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    kwargs: dict[str, Any] = {"task": "text-generation", "tokenizer": tokenizer}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if not remote:
        kwargs.update(dispatch=True, device_map=device if device_map is None else device_map)
        if max_memory is not None:
            kwargs["max_memory"] = max_memory
    lm = nnsight.TransformersModel(name, **kwargs)
    return NNsightModel(lm, name, tokenizer, remote=remote).eval()
