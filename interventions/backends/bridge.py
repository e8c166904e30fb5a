"""Backend for TransformerLens ``TransformerBridge`` (4.x, and the 3.9 preview); registers
:class:`BridgeAdapter`.

A bridge wraps a Hugging Face ``nn.Module`` and exposes the familiar hook names
(``blocks.{l}.hook_resid_post``, ``blocks.{l}.attn.hook_pattern``, ...). Differences from
``HookedTransformer`` that the adapter absorbs:

* ``model(tokens, stop_at_layer=n_layers)`` returns logits on a bridge: :meth:`BridgeAdapter.run_to_resid`
  ends the forward pass at the last ``hook_resid_post`` instead.
* ``forward(start_at_layer=k)`` (4.x only) still executes blocks ``0..k-1`` on discarded input.
  :meth:`BridgeAdapter.run_from` instead calls the bridge's block modules ``model.blocks[start..stop-1]``
  directly (every hook inside them fires), then ``model.ln_final`` and ``model.unembed``. The extra
  inputs the wrapped Hugging Face blocks take (attention mask, position ids, rotary
  ``position_embeddings`` from the model's own rotary module, ...) are captured once per sequence
  length and positions from the model's own forward pass, stopped before block 0 runs
  (:meth:`BridgeAdapter.block_inputs`), so every architecture gets what its blocks get in a full pass.
* Some bridges only *observe* an activation that the wrapped module already consumed (HF GPT-J
  attention: ``attn.hook_pattern``): see :mod:`interventions.edits`.

All transformer_lens / transformers imports happen inside functions, so this module imports under
every supported TransformerLens version and costs nothing until a bridge is used.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int

from ..adapter import Capabilities, ModelAdapter
from ..edits import without_user_hooks
from ..errors import InterventionError
from ..hooks import HookPointLike, resid_post
from ..tokenization import prepare_tokenizer
from ..types import Model, Tokenizer


class StopForward(Exception):
    """Raised by a hook to end a forward pass early; carries what the hook saw."""

    def __init__(self, payload: Any):
        super().__init__("forward pass stopped")
        self.payload = payload


BlockInputs = tuple[tuple[Any, ...], dict[str, Any]]
_BLOCK_INPUTS: weakref.WeakKeyDictionary[Any, dict[tuple, BlockInputs]] = weakref.WeakKeyDictionary()


class BridgeAdapter(ModelAdapter):
    """Access to a TransformerLens ``TransformerBridge`` (4.x, or the 3.9 preview).

    Hook lookup goes through the bridge's ``hook_dict`` (the same names as ``HookedTransformer``),
    token ids are read at ``model.embed``, ``embedding_matrix()`` is ``model.W_E``; shapes come from
    ``model.cfg`` (``n_key_value_heads`` is ``None`` without grouped-query attention).
    """

    backend = "bridge"
    capabilities = Capabilities(skips_blocks=True, positions=True, frozen_bos_kv=False, split_inputs=True)

    def run_to_resid(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """Residual ``[batch, pos, d_model]`` after the last block; final norm and unembedding are skipped.

        (A bridge's ``stop_at_layer=n_layers`` still runs the unembedding, so a hook on the last
        ``hook_resid_post`` ends the pass; it is added after any hook already there, which still runs.)
        """
        return self.run_until(lambda: self.model(tokens), resid_post(self.info.n_layers - 1))

    def embed(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """The residual entering block 0; the pass stops before block 0 runs (as on ``HookedTransformer``,
        ``blocks.0.hook_resid_pre`` does not fire)."""
        args, kwargs = self.block0_call(lambda: self.model(tokens))
        return args[0] if args else kwargs["hidden_states"]

    def forward_from(self, resid: Float[torch.Tensor, "batch pos d_model"], start: int, stop: int | None,
                     positions: Int[torch.Tensor, " pos"] | None) -> Float[torch.Tensor, "batch pos d_out"]:
        """:meth:`ModelAdapter.run_from`: only the block modules ``model.blocks[start..stop-1]`` run, with
        :meth:`block_inputs` (then ``model.ln_final`` and ``model.unembed`` when ``stop`` is None)."""
        x = resid
        end = self.info.n_layers if stop is None else stop
        if start < end:
            args, kwargs = self.block_inputs(resid.shape[1], positions, resid.device)
            for block in self.model.blocks[start:end]:
                out = block(x, *args, **kwargs)
                x = out[0] if isinstance(out, tuple) else out
        if stop is None:
            x = self.model.unembed(self.model.ln_final(x))
        return x

    def block_inputs(self, n_pos: int, positions: Int[torch.Tensor, " pos"] | None,
                     device: torch.device) -> BlockInputs:
        """The arguments after the hidden states with which the model's forward pass calls block 0, for
        one sequence of ``n_pos`` tokens at token positions ``positions`` (default ``0..n_pos-1``):
        attention mask, position ids, rotary ``position_embeddings``, ... (batch dimension 1, broadcast
        over any batch). Key-value caches are replaced by ``None`` and ``use_cache`` is off. Captured
        from one pass over placeholder ids that stops before block 0 runs (the user's hooks hidden; no
        block, block hook or block pre-hook runs) and memoised per model, length, positions, device and dtype."""
        key = (n_pos, None if positions is None else tuple(int(p) for p in positions), str(device), self.dtype())
        memo = _BLOCK_INPUTS.setdefault(self.model, {})
        if key not in memo:
            memo[key] = self.capture_block_inputs(n_pos, positions, device)
            if positions is not None:
                self.check_same_masks(memo[key], self.block_inputs(n_pos, None, device), positions)
        return memo[key]

    @staticmethod
    def check_same_masks(moved: BlockInputs, natural: BlockInputs, positions: Int[torch.Tensor, " pos"]) -> None:
        """``RuntimeError`` unless the mask tensors of ``moved`` equal those of ``natural`` (explicit
        positions must change where tokens sit, never which tokens they see)."""
        for name, value in moved[1].items():
            other = natural[1].get(name)
            if "mask" in name and isinstance(value, torch.Tensor) and not (
                    isinstance(other, torch.Tensor) and torch.equal(value, other)):
                raise RuntimeError(f"positions={positions.tolist()} changed the {name} this model's blocks get: "
                                   f"run_from cannot place tokens there on this model; run without positions")

    def capture_block_inputs(self, n_pos: int, positions: Int[torch.Tensor, " pos"] | None,
                             device: torch.device) -> BlockInputs:
        """:meth:`block_inputs` without the memo."""
        from transformers.cache_utils import Cache

        ids = torch.zeros(1, n_pos, dtype=torch.long, device=device)
        extra: dict[str, Any] = {"use_cache": False}
        if positions is not None:
            extra["position_ids"] = positions.to(device=device, dtype=torch.long).view(1, n_pos)
            # An explicit mask: without one Hugging Face reads gaps in position_ids as packed sequences.
            extra["attention_mask"] = torch.ones(1, n_pos, dtype=torch.long, device=device)
        with torch.inference_mode(False), torch.no_grad(), without_user_hooks(self):
            args, kwargs = self.block0_call(lambda: self.model(ids, **extra))
        rest = tuple(None if isinstance(a, Cache) else a for a in args[1:])
        kwargs = {k: (None if isinstance(v, Cache) else v) for k, v in kwargs.items() if k != "hidden_states"}
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        return rest, kwargs

    def block0_call(self, forward: Callable[[], Any]) -> BlockInputs:
        """``(args, kwargs)`` with which ``forward()`` calls ``model.blocks[0]``; the pass stops there, before
        any pre-hook or hook of block 0 runs."""

        def grab(module: Any, args: tuple, kwargs: dict) -> None:
            raise StopForward((args, kwargs))

        handle = self.model.blocks[0].register_forward_pre_hook(grab, with_kwargs=True, prepend=True)
        try:
            forward()
        except StopForward as done:
            return done.payload
        finally:
            handle.remove()
        raise RuntimeError(f"the forward pass of {type(self.model).__name__} never called model.blocks[0]: "
                           f"the bridge adapter needs a bridge whose blocks are registered as model.blocks")

    def run_until(self, forward: Callable[[], Any], exit_name: str) -> torch.Tensor:
        """``forward()`` ended at hook point ``exit_name``, whose activation (after every hook already
        there) is returned."""

        def stop(act: torch.Tensor, hook: HookPointLike | None = None) -> None:
            raise StopForward(act)

        try:
            with self.hooks([(exit_name, stop)]):
                forward()
        except StopForward as done:
            return done.payload
        raise RuntimeError(f"the forward pass of {type(self.model).__name__} never reached {exit_name}: "
                           f"check that the model's blocks are registered as model.blocks")


@functools.cache
def transformer_lens_major() -> int:
    """Major version of the installed TransformerLens (read once)."""
    import importlib.metadata

    return int(importlib.metadata.version("transformer-lens").split(".")[0])


def native_start_at_layer() -> bool:
    """Whether ``TransformerBridge.forward`` accepts ``start_at_layer`` (TransformerLens 4.x; the 3.9
    preview raises ``NotImplementedError``). :meth:`BridgeAdapter.run_from` does not need it."""
    return transformer_lens_major() >= 4


def is_bridge(model: Model) -> bool:
    """Whether ``model`` is a ``TransformerBridge`` (never imports TransformerLens itself)."""
    if "transformer_lens.model_bridge" not in sys.modules:
        return False  # no bridge can exist before its module was imported
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - a TransformerLens without the bridge
        return False
    return isinstance(model, TransformerBridge)




def boot(hf_model: Any, arch: str, tokenizer: Tokenizer) -> Any:
    """Wrap the Hugging Face causal LM ``hf_model`` as a ``TransformerBridge``, offline.

    ``arch`` only labels the model (``local/<arch>``: TransformerLens aliases such as ``gpt2`` would
    be renamed to hub models); ``tokenizer`` is required (otherwise TransformerLens downloads one).
    """
    from transformer_lens.model_bridge import TransformerBridge

    if tokenizer is None:
        raise InterventionError("boot() needs a tokenizer (without one TransformerLens downloads one): pass "
                                "e.g. interventions.tokenization.make_word_tokenizer(d_vocab)")
    hf_model.eval()
    # Everything is local: keep the hub offline while booting, then restore the caller's setting.
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        return TransformerBridge.boot_transformers(
            f"local/{arch}", hf_model=hf_model, tokenizer=prepare_tokenizer(tokenizer)
        )
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
