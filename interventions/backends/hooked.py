"""Backend for TransformerLens 3.x ``HookedTransformer`` (registers :class:`HookedAdapter`).

``HookedTransformer`` runs from any block natively (``start_at_layer`` / ``stop_at_layer``), so
:meth:`HookedAdapter.run_from` executes only the blocks asked for. Positions other than ``0..pos-1``
(capability ``positions``) re-rotate queries and keys at ``attn.hook_rot_q`` / ``attn.hook_rot_k``:
rotations compose, ``R(d) R(p) = R(p + d)``. The frozen BOS key and value (capability
``frozen_bos_kv``) come from TransformerLens's own key-value cache of a BOS-only pass, i.e. exactly as
attention stores them (after any q/k norm or clipping, before rotary).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int

from ..adapter import Capabilities, ModelAdapter, check_block_range
from ..errors import InterventionError
from ..hooks import HookPointLike
from ..types import Model

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


class HookedAdapter(ModelAdapter):
    """Access to a TransformerLens ``HookedTransformer`` (3.x): every :class:`Capabilities`."""

    backend = "hooked"
    model: HookedTransformer
    capabilities = Capabilities(skips_blocks=True, positions=True, frozen_bos_kv=True, split_inputs=True)
    _unembed_t: torch.Tensor | None = None
    _unembed_key: tuple[Any, ...] | None = None

    def run_to_resid(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.model(tokens, stop_at_layer=self.info.n_layers)

    def embed(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.model(tokens, stop_at_layer=0)

    def forward_from(self, resid: Float[torch.Tensor, "batch pos d_model"], start: int, stop: int | None,
                     positions: Int[torch.Tensor, " pos"] | None) -> Float[torch.Tensor, "batch pos d_out"]:
        """:meth:`ModelAdapter.run_from`: ``start_at_layer`` / ``stop_at_layer``, so only blocks
        ``start..stop-1`` run; explicit positions re-rotate queries and keys (:meth:`rotary_shift`)."""
        shifts = None if positions is None else positions.to(torch.long).cpu() - torch.arange(resid.shape[1])
        with self.rotary_shift(range(start, self.info.n_layers if stop is None else stop), shifts):
            return self.model(resid, start_at_layer=start, stop_at_layer=stop)

    def bos_key_values(
        self, bos: Int[torch.Tensor, "1 1"]
    ) -> list[tuple[Float[torch.Tensor, "n_kv_heads d_head"], Float[torch.Tensor, "n_kv_heads d_head"]]]:
        """Per block ``(key, value)``, each ``[n_kv_heads, d_head]``, of ``bos`` at position 0."""
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

        cache = TransformerLensKeyValueCache.init_cache(self.model.cfg, self.device(), batch_size=1)
        self.model(bos, past_kv_cache=cache, attention_mask=torch.ones_like(bos), return_type=None)
        return [(e.past_keys[0, 0].clone(), e.past_values[0, 0].clone()) for e in cache.entries]

    def run_last_from(
        self, resid: Float[torch.Tensor, "batch 1 d_model"], start: int, bos_kv: Any, position: int,
        stop: int | None = None,
    ) -> Float[torch.Tensor, "batch 1 d_out"]:
        from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

        check_block_range(self.info.n_layers, start, stop)
        b = resid.shape[0]
        end = self.info.n_layers if stop is None else stop
        kv: list[Any] = [None] * self.info.n_layers
        for i in range(start, end):
            k, v = bos_kv[i]
            kv[i] = TransformerLensKeyValueCacheEntry(
                past_keys=k.expand(b, 1, *k.shape), past_values=v.expand(b, 1, *v.shape), frozen=True
            )
        # After one cached position the token sits at position 1: rotate it on to ``position``.
        shifts = torch.tensor([position - 1])
        with self.rotary_shift(range(start, end), shifts):
            return self.model(resid, start_at_layer=start, stop_at_layer=stop, past_kv_cache=kv)

    def unembed(self, resid: Float[torch.Tensor, "rows d_model"]) -> Float[torch.Tensor, "rows d_vocab"]:
        """:meth:`ModelAdapter.unembed` as ``HookedTransformer.forward`` ends (final norm, ``unembed`` with
        its ``hook_in``/``hook_out``, logit soft cap), with the transposed unembedding kept between calls:
        TransformerLens's ``Unembed`` copies ``W_U.T`` (``d_model x d_vocab``, 113 MB for a 49,152-token
        vocabulary) on every call, which dominated the fast search's tails. Same product, same numbers."""
        from transformer_lens.utilities.activation_functions import apply_softcap

        model, u = self.model, self.model.unembed
        x = model.ln_final(resid) if model.cfg.normalization_type is not None else resid
        x = u.hook_in(x)
        logits = u.hook_out(torch.nn.functional.linear(x, self.unembedding_t(), u.b_U))
        return apply_softcap(logits, model.cfg.output_logits_soft_cap)

    def unembedding_t(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        """``W_U.T`` as a contiguous tensor, copied once per version of ``W_U`` (a changed or replaced weight
        is copied again)."""
        w = self.model.unembed.W_U
        key = (id(w), w.data_ptr(), w._version, w.device, w.dtype)
        if self._unembed_t is None or self._unembed_key != key:
            self._unembed_t = w.detach().T.contiguous()
            self._unembed_key = key
        return self._unembed_t

    @contextlib.contextmanager
    def rotary_shift(self, layers: range, shifts: Int[torch.Tensor, " m"] | None) -> Iterator[None]:
        """Inside the ``with`` block, rotate the queries and keys of the last ``m`` positions by ``shifts`` more
        positions (token positions; 0 leaves a position as it is) in blocks ``layers`` (0-indexed).
        Nothing happens for models without rotary positions or when every shift is 0."""
        cfg = self.model.cfg
        if shifts is None or not bool(shifts.any()) or cfg.positional_embedding_type != "rotary":
            yield
            return
        blocks = self.model.blocks
        with self.hooks([(f"blocks.{i}.attn.hook_rot_{x}", self.rotation(blocks[i].attn, shifts))
                         for i in layers for x in "qk"]):
            yield

    @staticmethod
    def rotation(attn: Any, shifts: Int[torch.Tensor, " m"]) -> Any:
        """A hook for ``hook_rot_q``/``hook_rot_k`` (``[batch, pos, heads, d_head]``) of attention module
        ``attn`` rotating its last ``len(shifts)`` positions by ``shifts``."""
        rd, n_table = int(attn.cfg.rotary_dim), attn.rotary_cos.shape[0]
        if int(shifts.max()) >= n_table or int(shifts.min()) < 0:
            raise InterventionError(f"rotary tables hold positions 0..{n_table - 1}, a shift of {shifts.tolist()} is "
                                    f"outside: use positions below n_ctx={n_table}")
        cos, sin = attn.rotary_cos[shifts], attn.rotary_sin[shifts]  # [m, rotary_dim]
        m = len(shifts)

        def fn(x: torch.Tensor, hook: HookPointLike | None = None) -> torch.Tensor:
            out = x.clone()
            part = x[:, -m:, :, :rd]
            c, s = cos.to(x.dtype)[:, None], sin.to(x.dtype)[:, None]  # [m, 1, rotary_dim]
            out[:, -m:, :, :rd] = part * c + attn.rotate_every_two(part) * s
            return out

        return fn


def is_hooked_transformer(model: Model) -> bool:
    """Whether ``model`` is a ``HookedTransformer`` (False on TransformerLens 4.x, which removed it)."""
    try:
        from transformer_lens import HookedTransformer
    except ImportError:  # TransformerLens 4.x removed it
        return False
    return isinstance(model, HookedTransformer)


