"""Evaluators of AF1 configurations: per-prompt metrics of ``(wait, transfer)`` on fixed prompts.

* :class:`NaiveEvaluator`: one complete intervened forward pass per configuration (the reference).
* :class:`BatchedEvaluator`: the same passes, several configurations of one wait per forward pass
  (:func:`interventions.run_many`; one request per prompt batch on a remote nnsight model).
* :class:`FastEvaluator`: exact shortcuts (ablated residual by lookup, shared transfer prefix, a
  last-position self-peek tail, one evaluation per distinct last token when ``transfer = 0``, one prompt
  for all under the plain-mean and zero baselines); see :mod:`circuits.search` for why each is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float, Int

import interventions as iv
from circuits.errors import ArgumentError, PromptError
from circuits.faithfulness import answer_width, last_token_metrics
from circuits.validation import check_choice
from interventions.readout import answer_positions, readout_metrics
from interventions.types import Model, Tokens

PerPrompt = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # correct, answer prob, logit diff


class Evaluator:
    """Per-prompt metrics of configurations, one wait at a time with increasing transfers."""

    def __init__(self, model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"], cache: Any, ablation: str,
                 batch_size: int):
        self.model = model
        self.tokens = tokens
        self.answers = answers
        self.cache = cache
        self.ablation = ablation
        self.batch_size = batch_size
        self.n_layers = iv.adapt(model).info.n_layers
        self.n_answer = answer_width(answers)  # answer tokens per prompt: the last n_answer positions are "last"
        self.passes = 0

    def subgraph(self, wait: int, transfer: int) -> list[iv.Intervention]:
        """The AF1 interventions of ``(wait, transfer)`` for these prompts (every answer position a last one)."""
        return iv.af1_subgraph(self.n_layers, wait, transfer, self.cache, self.ablation, n_last=self.n_answer)

    def begin_wait(self, wait: int) -> None:
        pass

    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k d_vocab"]:
        """Logits at the answer positions of every prompt under configuration ``(wait, transfer)``: the last
        position (``[batch, d_vocab]``), or the last ``k`` for answers of ``k`` tokens (``[batch, k, d_vocab]``)."""
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
    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k d_vocab"]:
        ivs = self.subgraph(wait, transfer)
        device = iv.adapt(self.model).device()  # iv.run moves token ids there too: a bridge does not
        logits = []
        for sl in self.batches():
            out = iv.run(self.model, self.tokens[sl], ivs) if ivs else self.model(self.tokens[sl].to(device))
            self.passes += 1
            logits.append(answer_positions(out, self.answers[sl]).float())
        return torch.cat(logits)


class BatchedEvaluator(NaiveEvaluator):
    """:class:`NaiveEvaluator`'s numbers with ``configs_per_pass`` configurations in each forward pass: asked
    for ``(wait, transfer)``, it evaluates that configuration and the next transfers of the same wait
    (up to ``configs_per_pass`` in all) together and keeps the others for when they are asked for. Only
    the answer readout of the last position comes back (:mod:`interventions.readout`: four numbers per
    prompt, computed on the server by a remote backend). Needs nothing of the adapter; with the
    ``configs_per_pass`` capability the configurations share one pass."""

    def __init__(self, *args: Any, configs_per_pass: int = 8, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.configs_per_pass = int(configs_per_pass)
        self.ready: dict[tuple[int, int], torch.Tensor] = {}

    def group(self, wait: int, transfer: int) -> list[tuple[int, int]]:
        """The configurations evaluated with ``(wait, transfer)``: it and the next transfers of ``wait``."""
        last = min(self.n_layers - 1 - wait, transfer + self.configs_per_pass - 1)
        return [(wait, t) for t in range(transfer, last + 1)]

    @torch.inference_mode()
    def readout(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch 4"]:
        """:func:`interventions.readout.answer_readout` of every prompt under ``(wait, transfer)``."""
        if (wait, transfer) not in self.ready:
            group = self.group(wait, transfer)
            subgraphs = [self.subgraph(w, t) for w, t in group]
            parts: list[list[torch.Tensor]] = [[] for _ in group]
            for sl in self.batches():
                outs = iv.run_many(self.model, [(self.tokens[sl], ivs) for ivs in subgraphs], logits="answer",
                                   answers=[self.answers[sl]] * len(group))
                self.passes += 1
                for part, out in zip(parts, outs):
                    part.append(out.float().cpu())
            self.ready = {c: torch.cat(part) for c, part in zip(group, parts)}
        return self.ready.pop((wait, transfer))

    def evaluate(self, wait: int, transfer: int) -> PerPrompt:
        return readout_metrics(self.readout(wait, transfer), self.answers)

    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k d_vocab"]:
        raise NotImplementedError("BatchedEvaluator reads only the answer readout: use evaluate(wait, transfer)")


def make_evaluator(model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"], cache: Any, *, ablation: str,
                   batch_size: int, method: str, configs_per_pass: int) -> Evaluator:
    """The evaluator for ``method`` on this model, chosen by the adapter's capabilities: ``"fast"`` is
    :class:`FastEvaluator` where the adapter skips blocks (``skips_blocks``), otherwise, like
    ``"naive"``, :class:`BatchedEvaluator` where it runs several configurations per pass
    (``configs_per_pass``) and :class:`NaiveEvaluator` elsewhere."""
    caps = iv.adapt(model).capabilities
    args = (model, tokens, answers, cache, ablation, batch_size)
    if method == "fast" and caps.skips_blocks:
        return FastEvaluator(*args)
    if caps.configs_per_pass:
        return BatchedEvaluator(*args, configs_per_pass=configs_per_pass)
    return FastEvaluator(*args) if method == "fast" else NaiveEvaluator(*args)


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
    unembedding. Under ``ablation="mean"`` or ``"zero"`` with ``wait >= 0`` every prompt enters block
    ``wait + 1`` with the same residual (BOS's own state, then a per-position mean or zeros: nothing of the
    prompt's tokens is left), so every prompt gets the same logits: one prompt is computed and repeated.

    The tail is chosen by the adapter's :class:`~interventions.adapter.Capabilities`: ``"last"`` needs
    ``frozen_bos_kv``; ``"pair"`` needs ``positions`` when the model's positions are rotary (the last
    token is run at its true position ``n_pos - 1``); ``"full"`` needs nothing. ``tail=None`` takes the
    first of these the adapter offers (``"full"`` when two positions are not exact for the model).
    """

    TAILS = ("last", "pair", "full")

    def __init__(self, *args: Any, tail: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.n_pos = int(self.tokens.shape[1])
        if bool((self.tokens[:, 0] != self.tokens[0, 0]).any()):
            raise PromptError("position 0 must hold the same token (BOS) in every prompt")
        exact = two_position_exact(self.model.cfg)
        # Whether the tails pass the last token's true position (rotary positions live in the blocks;
        # learned absolute ones are part of the residual already).
        self.rotary = getattr(self.model.cfg, "positional_embedding_type", None) == "rotary"
        ad = self.adapter = iv.adapt(self.model)
        caps = ad.capabilities
        usable = {"last": caps.frozen_bos_kv, "pair": caps.positions or not self.rotary, "full": True}
        if tail is None:
            tail = next(t for t in self.TAILS if usable[t]) if exact else "full"
        self.tail = tail
        check_choice("tail", self.tail, self.TAILS)
        if self.tail != "full" and not exact:
            raise ArgumentError(f"tail={self.tail!r} is not exact for this model's positions: use tail='full'")
        if not usable[self.tail]:
            need = "frozen_bos_kv" if self.tail == "last" else "positions"
            other = next(t for t in self.TAILS if usable[t])
            raise ArgumentError(
                f"tail={self.tail!r} needs the {need} capability, which this {ad.backend} adapter lacks "
                f"({'a frozen BOS key-value cache' if self.tail == 'last' else 'rotary positions'}): use "
                f"tail={other!r} or leave tail=None")
        self.device, self.dtype = ad.device(), ad.dtype()
        # The model's own BOS state (and, for tail="last", its key and value) in every block. BOS
        # attends only to itself (also under every AF1 intervention), so they are the same in every
        # prompt and configuration.
        bos: list[torch.Tensor] = []
        bos_tok = self.tokens[:1, :1].to(self.device)
        names = [iv.adapter.resid_post(i) for i in range(self.n_layers)]
        self.bos_kv: Any = None
        with torch.inference_mode(), ad.hooks([(n, lambda act, hook=None: bos.append(act[0, 0].detach().clone()))
                                               for n in names]):
            if self.tail == "last":
                self.bos_kv = ad.bos_key_values(bos_tok)
            else:
                ad.run_to_resid(bos_tok)
        self.passes += 1
        self.bos = torch.stack(bos)  # [n_layers, d_model]
        self.entry_idx = (
            self.cache.entry_index(self.tokens, tokenizer=getattr(self.model, "tokenizer", None))
            if (self.cache is not None and self.ablation == "cama") else None
        )
        self.wait: int | None = None
        self.states: list[torch.Tensor] = []
        self.depth = 0  # transfer blocks applied to self.states

    def start(self, wait: int, sl: slice | torch.Tensor) -> Float[torch.Tensor, "batch pos d_model"]:
        """Residual after block ``wait`` of prompts ``sl``, ablated (``wait >= 0``), or the embeddings
        (``wait = -1``)."""
        toks = self.tokens[sl].to(self.device)
        if wait < 0:
            self.passes += 1
            return self.adapter.embed(toks)
        b = toks.shape[0]
        resid = torch.empty(b, self.n_pos, self.bos.shape[-1], device=self.device, dtype=self.dtype)
        resid[:, 0] = self.bos[wait]
        if self.ablation == "cama":
            assert self.entry_idx is not None  # set in __init__ for CAMA
            table = self.cache.on("cond_mean", self.device, self.dtype)[wait]
            resid[:, 1:] = table[self.entry_idx[sl, 1:].to(self.device)]
        elif self.ablation == "mean":
            resid[:, 1:] = self.cache.on("pos_mean", self.device, self.dtype)[wait, 1:]
        else:
            resid[:, 1:] = 0.0
        return resid

    def begin_wait(self, wait: int) -> None:
        self.wait = wait
        self.states = []
        self.depth = 0

    @torch.inference_mode()
    def advance(self) -> None:
        """Apply one more transfer block (last token full peek, others self peek) to every batch."""
        assert self.wait is not None, "advance() follows begin_wait()"
        layer = self.wait + 1 + self.depth
        peek = [iv.Peek([layer], mode="self", queries="others", n_last=self.n_answer)]
        for i, resid in enumerate(self.states):
            with iv.apply(self.model, peek, check_fired=True):
                self.states[i] = self.adapter.run_from(resid, layer, layer + 1)
            self.passes += 1
        self.depth += 1

    @torch.inference_mode()
    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k d_vocab"]:
        if wait != self.wait:
            self.begin_wait(wait)
        if wait >= 0 and self.ablation in ("mean", "zero"):
            # The same residual for every prompt after `wait` (see the class docstring): one prompt for all.
            if not self.states:
                self.states = [self.start(wait, slice(0, 1))]
            if transfer < self.depth:
                raise RuntimeError(f"transfers of one wait must be evaluated in increasing order "
                                   f"({transfer} < {self.depth})")
            while self.depth < transfer:
                self.advance()
            one = self.tail_logits(self.states, wait + 1 + transfer)
            return one.expand(int(self.tokens.shape[0]), *one.shape[1:]).contiguous()
        if transfer == 0:
            # No transfer block: every block after `wait` self-peeks, so the answer depends only on the
            # answer positions' states after `wait` (each a function of its own token: a cached mean, a
            # constant or an embedding) and BOS. Evaluate one prompt per distinct last token(s).
            last = self.tokens[:, -1] if self.n_answer == 1 else self.tokens[:, -self.n_answer:]
            uniq, inverse = torch.unique(last, dim=0, return_inverse=True)
            rep = torch.empty(len(uniq), dtype=torch.long).scatter_(0, inverse, torch.arange(len(inverse)))
            starts = [self.start(wait, rep[s : s + self.batch_size]) for s in range(0, len(rep), self.batch_size)]
            logits = self.tail_logits(starts, wait + 1)
            return logits[inverse.to(logits.device)]
        if not self.states:
            self.states = [self.start(wait, sl) for sl in self.batches()]
        if transfer < self.depth:
            raise RuntimeError(f"transfers of one wait must be evaluated in increasing order "
                               f"({transfer} < {self.depth})")
        while self.depth < transfer:
            self.advance()
        start = wait + 1 + transfer
        return self.tail_logits(self.states, start)

    def tail_logits(self, resids: list[Float[torch.Tensor, "batch pos d_model"]],
                    start: int) -> Float[torch.Tensor, "n *k d_vocab"]:
        """Logits at the answer positions after blocks ``start..n_layers-1`` (0-indexed) with every token
        self-peeking, for the prompts of every batch in ``resids`` (residuals entering block ``start``),
        concatenated: ``[n, d_vocab]`` for one answer token, ``[n, k, d_vocab]`` for ``k``. Under self-peek
        each answer position reads only BOS and itself, so the "pair" and "last" tails run each of them on
        its own, at its true position; they keep only the rows they need and run them in chunks of
        ``batch_size * (n_pos // rows kept)`` prompts (about the memory of one batch)."""
        k = self.n_answer
        if self.tail == "full" and start < self.n_layers:
            out = torch.cat([self.full_chunk(resid, start) for resid in resids])
        else:
            per_position = []
            for pos in range(self.n_pos - k, self.n_pos):
                cols = [0, pos] if self.tail == "pair" else [pos]
                rows = torch.cat([resid[:, cols] for resid in resids])
                step = self.batch_size * max(1, self.n_pos // len(cols))
                per_position.append(torch.cat([self.tail_chunk(rows[i : i + step], start, pos)
                                               for i in range(0, len(rows), step)]))
            out = torch.stack(per_position, dim=1)
        return out[:, 0] if k == 1 else out

    def full_chunk(self, x: Float[torch.Tensor, "batch pos d_model"],
                   start: int) -> Float[torch.Tensor, "batch k d_vocab"]:
        """The ``"full"`` tail over every position of ``x`` (the residual entering block ``start``), with every
        token self-peeking: ``[batch, k, d_vocab]`` at the answer positions."""
        self.passes += 1
        layers = list(range(start, self.n_layers))
        with iv.apply(self.model, [iv.Peek(layers, mode="self", queries="all")], check_fired=True):
            return self.adapter.run_from(x, start)[:, -self.n_answer:].float()

    def tail_chunk(self, x: Float[torch.Tensor, "batch rows d_model"], start: int, pos: int
                   ) -> Float[torch.Tensor, "batch d_vocab"]:
        """One tail pass (see :meth:`tail_logits`) over ``x``: ``[BOS, row]`` (``"pair"``) or ``[row]``
        (``"last"``, and any tail after the last block) of the residual entering block ``start``, for the answer
        position ``pos`` (0-indexed in the prompt); the logits of that row."""
        self.passes += 1
        ad = self.adapter
        if start >= self.n_layers:
            return ad.run_from(x[:, -1:], self.n_layers)[:, -1].float()
        at = pos if self.rotary else None  # the row's position inside the blocks
        # With only BOS and one answer row "self peek" is the ordinary causal row: no mask is needed.
        if self.tail == "pair":
            positions = None if at is None else torch.tensor([0, at])
            return ad.run_from(x, start, positions=positions)[:, -1].float()
        # "last": BOS enters only through its (constant) key and value
        return ad.run_last_from(x, start, self.bos_kv, 1 if at is None else at)[:, -1].float()
