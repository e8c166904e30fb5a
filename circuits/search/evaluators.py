"""Evaluators of AF1 configurations: per-prompt metrics of ``(wait, transfer)`` on fixed prompts.

* :class:`NaiveEvaluator`: one complete intervened forward pass per configuration (the reference).
* :class:`BatchedEvaluator`: the same passes, several configurations of one wait per forward pass
  (:func:`interventions.run_many`; one request per prompt batch on a remote nnsight model).
* :class:`FastEvaluator`: exact shortcuts (ablated residual by lookup, shared transfer prefix, a
  last-position self-peek tail, one evaluation per distinct last token when ``transfer = 0``, one prompt
  for all under the plain-mean and zero baselines); see :mod:`circuits.search` for why each is exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float, Int

import interventions as iv
from circuits.errors import ArgumentError, PromptError
from circuits.faithfulness import answer_width, last_token_metrics
from circuits.search.tails import PHASES, WaitTails
from circuits.validation import check_choice
from interventions.readout import answer_positions, answer_readout, readout_metrics
from interventions.types import Model, Tokens

PerPrompt = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # correct, answer prob, logit diff


class Evaluator:
    """Per-prompt metrics of configurations, one wait at a time with increasing transfers."""

    def __init__(self, model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"],
                 cache: iv.MeanCache | None, ablation: str, batch_size: int):
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


def make_evaluator(model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"], cache: iv.MeanCache | None, *,
                   ablation: str, batch_size: int, method: str, configs_per_pass: int) -> Evaluator:
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

    The configurations of one wait are evaluated together, block by block (:class:`WaitTails`): every
    answer row that enters block ``s``, from any transfer of the wait and any prompt batch, goes through
    block ``s`` in one call (chunked to about one batch's memory); every tail ends after the last block,
    where the rows are unembedded in chunks and reduced at once to the four readout numbers
    (:func:`interventions.readout.answer_readout`). ``transfers_per_pass`` (default: every remaining
    transfer of the wait) bounds how many transfers are evaluated together; results wait in
    :attr:`ready` until asked for.

    The tail is chosen by the adapter's :class:`~interventions.adapter.Capabilities`: ``"last"`` needs
    ``frozen_bos_kv``; ``"pair"`` needs ``positions`` when the model's positions are rotary (the last
    token is run at its true position ``n_pos - 1``); ``"full"`` needs nothing. ``tail=None`` takes the
    first of these the adapter offers (``"full"`` when two positions are not exact for the model).
    """

    TAILS = ("last", "pair", "full")

    def __init__(self, *args: Any, tail: str | None = None, transfers_per_pass: int | None = None, **kwargs: Any):
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
        self.transfers_per_pass = transfers_per_pass
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
        self.ready: dict[tuple[int, int], torch.Tensor] = {}
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def start(self, wait: int, sl: slice | torch.Tensor) -> Float[torch.Tensor, "batch pos d_model"]:
        """Residual after block ``wait`` of prompts ``sl``, ablated (``wait >= 0``), or the embeddings
        (``wait = -1``)."""
        t0 = time.perf_counter()
        toks = self.tokens[sl].to(self.device)
        if wait < 0:
            self.passes += 1
            out = self.adapter.embed(toks)
            self.seconds["lookup"] += time.perf_counter() - t0
            return out
        b = toks.shape[0]
        resid = torch.empty(b, self.n_pos, self.bos.shape[-1], device=self.device, dtype=self.dtype)
        resid[:, 0] = self.bos[wait]
        if self.ablation == "cama":
            assert self.entry_idx is not None and self.cache is not None  # set in __init__ for CAMA
            table = self.cache.on("cond_mean", self.device, self.dtype)[wait]
            resid[:, 1:] = table[self.entry_idx[sl, 1:].to(self.device)]
        elif self.ablation == "mean":
            assert self.cache is not None  # a means ablation has its cache
            resid[:, 1:] = self.cache.on("pos_mean", self.device, self.dtype)[wait, 1:]
        else:
            resid[:, 1:] = 0.0
        self.seconds["lookup"] += time.perf_counter() - t0
        return resid

    def begin_wait(self, wait: int) -> None:
        self.wait = wait
        self.states = []
        self.depth = 0
        self.ready = {}

    def shared(self, wait: int) -> bool:
        """Whether every prompt enters block ``wait + 1`` with the same residual (the mean/zero baselines)."""
        return wait >= 0 and self.ablation in ("mean", "zero")

    @torch.inference_mode()
    def advance(self) -> None:
        """Apply one more transfer block (last token full peek, others self peek) to every batch."""
        assert self.wait is not None, "advance() follows begin_wait()"
        t0 = time.perf_counter()
        layer = self.wait + 1 + self.depth
        peek = [iv.Peek([layer], mode="self", queries="others", n_last=self.n_answer)]
        for i, resid in enumerate(self.states):
            with iv.apply(self.model, peek, check_fired=True):
                self.states[i] = self.adapter.run_from(resid, layer, layer + 1)
            self.passes += 1
        self.depth += 1
        self.seconds["prefix"] += time.perf_counter() - t0

    def group(self, wait: int, transfer: int) -> list[int]:
        """The transfers of ``wait`` evaluated together with ``transfer``: it and the next ones (all
        remaining, or up to ``transfers_per_pass`` in all)."""
        last = self.n_layers - 1 - wait
        if self.transfers_per_pass is not None:
            last = min(last, transfer + self.transfers_per_pass - 1)
        return list(range(transfer, last + 1))

    @torch.inference_mode()
    def final_rows(self, wait: int, transfers: list[int]) -> dict[int, tuple[Float[torch.Tensor, "rows k d_model"],
                                                                            Int[torch.Tensor, " batch"] | None]]:
        """Per transfer in ``transfers`` (increasing, none below :attr:`depth`): the residual of the answer
        positions after the last block, ``[rows, k, d_model]``, computed block by block for all of them
        together (see the class docstring), and which row each prompt reads (``None``: row ``i`` is prompt
        ``i``; otherwise ``[batch]`` indices: under the baselines one row serves every prompt, and with
        ``transfer = 0`` one row serves every prompt of the same answer-position tokens)."""
        if wait != self.wait:
            self.begin_wait(wait)
        if transfers[0] < self.depth:
            raise RuntimeError(f"transfers of one wait must be evaluated in increasing order "
                               f"({transfers[0]} < {self.depth})")
        shared = self.shared(wait)
        if shared and not self.states:
            self.states = [self.start(wait, slice(0, 1))]
        tails = WaitTails(self.adapter, self.tail, self.n_pos, self.n_answer, bos_kv=self.bos_kv, rotary=self.rotary,
                          chunk=self.batch_size, seconds=self.seconds)
        inverse: torch.Tensor | None = None
        for s in range(wait + 1, self.n_layers + 1):
            t = s - wait - 1
            if t in transfers:
                if t == 0 and not shared:
                    # No transfer block: the answer positions' states after `wait` are each a function of
                    # their own token (and BOS): one prompt per distinct answer-position token(s).
                    last = self.tokens[:, -self.n_answer:]
                    uniq, inverse = torch.unique(last, dim=0, return_inverse=True)
                    rep = torch.empty(len(uniq), dtype=torch.long).scatter_(0, inverse, torch.arange(len(inverse)))
                    tails.add(0, [self.start(wait, rep[i : i + self.batch_size])
                                  for i in range(0, len(rep), self.batch_size)])
                else:
                    if not self.states:
                        self.states = [self.start(wait, sl) for sl in self.batches()]
                    while self.depth < t:
                        self.advance()
                    tails.add(t, self.states)
            if s == self.n_layers:
                break
            tails.run_block(s)
        self.passes += tails.calls
        out: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {t: (r, None) for t, r in tails.final().items()}
        if shared:  # one prompt computed: every prompt reads its rows
            out = {t: (r, torch.zeros(int(self.tokens.shape[0]), dtype=torch.long)) for t, (r, _) in out.items()}
        elif 0 in out:
            assert inverse is not None
            out[0] = (out[0][0], inverse)
        return out

    @torch.inference_mode()
    def readout(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k 4"]:
        """:func:`interventions.readout.answer_readout` of every prompt under ``(wait, transfer)``."""
        if wait != self.wait:
            self.begin_wait(wait)
        if (wait, transfer) not in self.ready:
            rows = self.final_rows(wait, self.group(wait, transfer))
            t0 = time.perf_counter()
            self.ready = self.read_all(wait, rows)
            self.seconds["unembed"] += time.perf_counter() - t0
        return self.ready.pop((wait, transfer))

    def read_all(self, wait: int, rows: dict[int, tuple[Float[torch.Tensor, "rows k d_model"],
                                                      Int[torch.Tensor, " batch"] | None]]
                 ) -> dict[tuple[int, int], Float[torch.Tensor, "batch *k 4"]]:
        """The readout of every transfer in ``rows`` (:meth:`final_rows`). The rows of every prompt (no ``index``)
        of all these transfers are unembedded together, in chunks of ``batch_size * n_pos`` rows (the logits of
        one batch of a complete pass): one pass over the unembedding matrix serves many configurations."""
        out = {(wait, t): self.read(r, index) for t, (r, index) in rows.items() if index is not None}
        own = [t for t, (_, index) in rows.items() if index is None]
        if own:
            n, k = int(self.tokens.shape[0]), self.n_answer
            flat = torch.cat([rows[t][0].reshape(n * k, -1) for t in own])
            answers = self.answers.reshape(n * k).repeat(len(own))
            step = max(1, self.batch_size) * self.n_pos
            read = torch.cat([answer_readout(self.adapter.unembed(flat[i : i + step]), answers[i : i + step]).cpu()
                              for i in range(0, len(flat), step)])
            for j, t in enumerate(own):
                r = read[j * n * k : (j + 1) * n * k].reshape(n, k, -1)
                out[(wait, t)] = r[:, 0] if self.answers.ndim == 1 else r
        return out

    def read(self, rows: Float[torch.Tensor, "rows k d_model"],
             index: Int[torch.Tensor, " batch"] | None) -> Float[torch.Tensor, "batch *k 4"]:
        """The readout of every prompt from final residual rows (``index``: see :meth:`final_rows`): unembedded
        in chunks of ``batch_size`` prompts, each chunk reduced to four numbers per answer token before the
        next is unembedded. Rows shared by several prompts are unembedded once."""
        n, k = int(self.tokens.shape[0]), self.n_answer
        answers = self.answers.reshape(n, k)
        step = max(1, self.batch_size)
        if index is None:
            parts = [answer_readout(self.unembed(rows[i : i + step]), answers[i : i + step]) for i in range(0, n, step)]
        else:
            logits = self.unembed(rows)
            parts = [answer_readout(logits[index[i : i + step].to(logits.device)], answers[i : i + step])
                     for i in range(0, n, step)]
        out = torch.cat([p.cpu() for p in parts])
        return out[:, 0] if self.answers.ndim == 1 else out

    def unembed(self, rows: Float[torch.Tensor, "rows k d_model"]) -> Float[torch.Tensor, "rows k d_vocab"]:
        """Final norm and unembedding of ``[rows, k, d_model]`` (the adapter's ``unembed``)."""
        r, k = int(rows.shape[0]), int(rows.shape[1])
        return self.adapter.unembed(rows.reshape(r * k, -1)).reshape(r, k, -1)

    def evaluate(self, wait: int, transfer: int) -> PerPrompt:
        return readout_metrics(self.readout(wait, transfer), self.answers)

    @torch.inference_mode()
    def last_logits(self, wait: int, transfer: int) -> Float[torch.Tensor, "batch *k d_vocab"]:
        """The answer logits of ``(wait, transfer)`` alone (all ``d_vocab`` of them; the search reads
        :meth:`readout`)."""
        if wait != self.wait or transfer < self.depth:
            self.begin_wait(wait)
        rows, index = self.final_rows(wait, [transfer])[transfer]
        logits = self.unembed(rows).float()
        if index is not None:
            logits = logits[index.to(logits.device)]
        return logits[:, 0] if self.answers.ndim == 1 else logits
