"""Evaluators of AF1 configurations: per-prompt metrics of ``(wait, transfer)`` on fixed prompts.

* :class:`NaiveEvaluator`: one complete intervened forward pass per configuration (the reference).
* :class:`FastEvaluator`: exact shortcuts (ablated residual by lookup, shared transfer prefix, a
  last-position self-peek tail, one evaluation per distinct last token when ``transfer = 0``); see
  :mod:`circuits.search` for why each is exact.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from jaxtyping import Float

import interventions as iv
from circuits.faithfulness import last_token_metrics
from interventions.types import Tokens
from interventions.validation import check_choice


PerPrompt = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # correct, answer prob, logit diff


class Evaluator:
    """Per-prompt metrics of configurations, one wait at a time with increasing transfers."""

    def __init__(self, model: Any, tokens: Tokens, answers: torch.Tensor, cache: Any, ablation: str, batch_size: int):
        self.model = model
        self.tokens = tokens
        self.answers = answers
        self.cache = cache
        self.ablation = ablation
        self.batch_size = batch_size
        self.n_layers = iv.adapt(model).info.n_layers
        self.passes = 0

    def begin_wait(self, wait: int) -> None:
        pass

    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch d_vocab"]:
        """Last-position logits of every prompt under configuration ``(wait, transfer)``."""
        raise NotImplementedError

    def evaluate(self, wait: int, transfer: int) -> PerPrompt:
        """Per prompt: correct (argmax == answer), answer probability, answer minus best other logit."""
        return last_token_metrics(self.last_logits(wait, transfer), self.answers)

    def batches(self) -> Iterator[slice]:
        n = self.tokens.shape[0]
        for start in range(0, n, self.batch_size):
            yield slice(start, min(start + self.batch_size, n))


class NaiveEvaluator(Evaluator):
    """One complete intervened forward pass per configuration (``iv.run`` with ``af1_subgraph``)."""

    @torch.inference_mode()
    def last_logits(self, wait: int, transfer: int) -> torch.Tensor:
        ivs = iv.af1_subgraph(self.n_layers, wait, transfer, self.cache, self.ablation)
        logits = []
        for sl in self.batches():
            out = iv.run(self.model, self.tokens[sl], ivs) if ivs else self.model(self.tokens[sl])
            self.passes += 1
            logits.append(out[:, -1].float())
        return torch.cat(logits)


def two_position_exact(cfg: Any) -> bool:
    """Whether the all-self-peek blocks may run on ``[BOS, last]`` alone without changing the last
    position: true for learned absolute (``standard``) and ``rotary`` positions with global attention."""
    pos_type = getattr(cfg, "positional_embedding_type", None)
    if pos_type not in ("standard", "rotary"):
        return False
    if getattr(cfg, "use_logn_attn", False) or getattr(cfg, "use_dynamic_ntk_rope", False):
        return False
    if any(t != "global" for t in (getattr(cfg, "attn_types", None) or [])):
        return False
    if getattr(cfg, "window_size", None):
        return False
    return True


class FastEvaluator(Evaluator):
    """Exact shortcuts (see the module docstring): ablated residual by lookup, shared transfer prefix,
    self-peek tail on the last position only (``tail="last"``; ``"pair"``: ``[BOS, last]``; ``"full"``:
    every position), one evaluation per distinct last token when ``transfer = 0``, last-position
    unembedding."""

    TAILS = ("last", "pair", "full")

    def __init__(self, *args: Any, tail: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        model = self.model
        self.n_pos = int(self.tokens.shape[1])
        if bool((self.tokens[:, 0] != self.tokens[0, 0]).any()):
            raise ValueError("position 0 must hold the same token (BOS) in every prompt")
        exact = two_position_exact(model.cfg)
        self.rotary = getattr(model.cfg, "positional_embedding_type", None) == "rotary"
        ad = self.adapter = iv.adapt(model)
        hooked = ad.backend == "hooked"
        # "last" reads HookedTransformer's key-value cache and "pair" with rotary positions its rotary
        # tables; a bridge gets "pair" where positions live in the residual, "full" otherwise.
        default = "last" if hooked else ("pair" if not self.rotary else "full")
        self.tail = (default if exact else "full") if tail is None else tail
        check_choice("tail", self.tail, self.TAILS)
        if self.tail != "full" and not exact:
            raise ValueError(f"tail={self.tail!r} is not exact for this model's positions: use tail='full'")
        if not hooked and (self.tail == "last" or (self.tail == "pair" and self.rotary)):
            raise ValueError(
                f"tail={self.tail!r} on this {ad.backend} model needs HookedTransformer internals (its "
                f"key-value cache{'' if self.tail == 'last' else ' and rotary tables'}): use "
                f"tail={'pair' if not self.rotary else 'full'!r} or leave tail=None")
        self.device, self.dtype = ad.device(), ad.dtype()
        # The model's own BOS state (and, for tail="last", its key and value) in every block. BOS
        # attends only to itself (also under every AF1 intervention), so they are the same in every
        # prompt and configuration. The keys and values are taken from TransformerLens's own key-value
        # cache of a BOS-only pass, i.e. exactly as attention stores them (after any q/k norm or
        # clipping, before rotary).
        bos: list[torch.Tensor] = []
        level = iv.adapter.new_hook_level()
        names = [iv.adapter.resid_post(i) for i in range(self.n_layers)]
        for name in names:
            ad.add_hook(name, lambda act, hook=None: bos.append(act[0, 0].detach().clone()), level)
        bos_tok = self.tokens[:1, :1].to(self.device)
        try:
            with torch.inference_mode():
                if self.tail == "last":
                    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

                    kv_cache = TransformerLensKeyValueCache.init_cache(model.cfg, self.device, batch_size=1)
                    self.model(bos_tok, past_kv_cache=kv_cache, attention_mask=torch.ones_like(bos_tok),
                               return_type=None)
                    self.bos_k = [e.past_keys[0, 0].clone() for e in kv_cache.entries]  # [n_kv_heads, d_head]
                    self.bos_v = [e.past_values[0, 0].clone() for e in kv_cache.entries]
                else:
                    ad.run_to_resid(bos_tok)
                self.passes += 1
        finally:
            ad.remove_hooks(names, level)
        self.bos = torch.stack(bos)  # [n_layers, d_model]
        self.entry_idx = (
            self.cache.entry_index(self.tokens) if (self.cache is not None and self.ablation == "cama") else None
        )
        self._wait: int | None = None
        self._states: list[torch.Tensor] = []
        self._depth = 0  # transfer blocks applied to self._states

    # residual after block `wait`, ablated (wait >= 0) or the embeddings (wait = -1)
    def _start(self, wait: int, sl: slice | torch.Tensor) -> torch.Tensor:
        toks = self.tokens[sl].to(self.device)
        if wait < 0:
            self.passes += 1
            return self.adapter.embed(toks)
        b = toks.shape[0]
        resid = torch.empty(b, self.n_pos, self.bos.shape[-1], device=self.device, dtype=self.dtype)
        resid[:, 0] = self.bos[wait]
        if self.ablation == "cama":
            table = self.cache.on("cond_mean", self.device, self.dtype)[wait]
            resid[:, 1:] = table[self.entry_idx[sl, 1:].to(self.device)]
        elif self.ablation == "mean":
            resid[:, 1:] = self.cache.on("pos_mean", self.device, self.dtype)[wait, 1:]
        else:
            resid[:, 1:] = 0.0
        return resid

    def begin_wait(self, wait: int) -> None:
        self._wait = wait
        self._states = []
        self._depth = 0

    @torch.inference_mode()
    def _advance(self) -> None:
        """Apply one more transfer block (last token full peek, others self peek) to every batch."""
        layer = self._wait + 1 + self._depth
        peek = [iv.Peek([layer], mode="self", queries="others")]
        for i, resid in enumerate(self._states):
            with iv.apply(self.model, peek, check_fired=True):
                self._states[i] = self.adapter.run_from(resid, layer, layer + 1)
            self.passes += 1
        self._depth += 1

    @torch.inference_mode()
    def last_logits(self, wait: int, transfer: int) -> torch.Tensor:
        if wait != self._wait:
            self.begin_wait(wait)
        if transfer == 0:
            # No transfer block: every block after `wait` self-peeks, so the answer depends only on the
            # last position's state after `wait` (a function of the last token: a cached mean, a
            # constant or an embedding) and BOS. Evaluate one prompt per distinct last token.
            uniq, inverse = torch.unique(self.tokens[:, -1], return_inverse=True)
            rep = torch.empty(len(uniq), dtype=torch.long).scatter_(0, inverse, torch.arange(len(inverse)))
            logits = torch.cat([
                self._tail(self._start(wait, rep[s : s + self.batch_size]), wait + 1)
                for s in range(0, len(rep), self.batch_size)
            ])
            return logits[inverse.to(logits.device)]
        if not self._states:
            self._states = [self._start(wait, sl) for sl in self.batches()]
        if transfer < self._depth:
            raise RuntimeError(f"transfers of one wait must be evaluated in increasing order ({transfer} < {self._depth})")
        while self._depth < transfer:
            self._advance()
        start = wait + 1 + transfer
        return torch.cat([self._tail(resid, start) for resid in self._states])

    def _tail(self, resid: torch.Tensor, start: int) -> torch.Tensor:
        """Last-position logits after blocks ``start..n_layers-1`` with every token self-peeking."""
        self.passes += 1
        if start >= self.n_layers:
            return self.adapter.run_from(resid[:, -1:], self.n_layers)[:, -1].float()
        layers = list(range(start, self.n_layers))
        if self.tail == "full":
            with iv.apply(self.model, [iv.Peek(layers, mode="self", queries="all")], check_fired=True):
                return self.adapter.run_from(resid, start)[:, -1].float()
        # With only BOS and the last token "self peek" is the ordinary causal row: no mask is needed.
        if self.tail == "pair":
            x, kv = resid[:, [0, self.n_pos - 1]], None
        else:  # "last": BOS enters only through its (constant) key and value, as a frozen KV cache
            from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

            b = resid.shape[0]
            kv = [None] * self.n_layers
            for i in layers:
                kv[i] = TransformerLensKeyValueCacheEntry(
                    past_keys=self.bos_k[i].expand(b, 1, *self.bos_k[i].shape),
                    past_values=self.bos_v[i].expand(b, 1, *self.bos_v[i].shape),
                    frozen=True,
                )
            x = resid[:, -1:]
        shift = self.n_pos - 2  # the last token sits at position 1 in these passes, truly at n_pos-1
        needs_shift = self.rotary and shift != 0
        if kv is None and not needs_shift:
            return self.adapter.run_from(x, start)[:, -1].float()
        # HookedTransformer only (see __init__): a frozen BOS cache and/or the re-rotated last position
        with _rotary_shift(self.model, layers, shift) if needs_shift else contextlib.nullcontext():
            return self.model(x, start_at_layer=start, past_kv_cache=kv)[:, -1].float()


class _rotary_shift:
    """Rotate the query and key of the last position (position 1) by ``shift`` more positions in blocks
    ``layers``, so that in a pass over ``[BOS, last]`` (or ``last`` after a cached BOS) the last token
    sits at its true position ``1 + shift``. Rotations compose: ``R(shift) R(1) = R(1 + shift)``; BOS
    stays at position 0."""

    def __init__(self, model: Any, layers: list[int], shift: int):
        self.model, self.layers, self.shift = model, layers, shift
        self.ad = iv.adapt(model)
        self.level = iv.adapter.new_hook_level()
        self.names: list[str] = []

    def _hook(self, attn: Any):
        rd = int(attn.cfg.rotary_dim)
        if self.shift >= attn.rotary_cos.shape[0]:
            raise ValueError(f"rotary tables hold {attn.rotary_cos.shape[0]} positions, need {self.shift + 1}")
        cos, sin = attn.rotary_cos[self.shift], attn.rotary_sin[self.shift]

        def fn(x: torch.Tensor, hook: Any = None) -> torch.Tensor:
            out = x.clone()
            last = x[:, -1, :, :rd]
            out[:, -1, :, :rd] = last * cos.to(x.dtype) + attn.rotate_every_two(last) * sin.to(x.dtype)
            return out

        return fn

    def __enter__(self) -> None:
        for layer in self.layers:
            attn = self.model.blocks[layer].attn
            for name in (f"blocks.{layer}.attn.hook_rot_q", f"blocks.{layer}.attn.hook_rot_k"):
                self.ad.add_hook(name, self._hook(attn), self.level)
                self.names.append(name)

    def __exit__(self, *exc: Any) -> None:
        self.ad.remove_hooks(self.names, self.level)
