"""AF1 search: the latest ``wait`` and the shortest ``transfer`` that keep the model faithful.

A configuration ``(wait, transfer)`` of a model with ``n_layers`` blocks (0-indexed) is the subgraph
``interventions.af1_subgraph(n_layers, wait, transfer, cache, ablation)``:

* the residual after block ``wait`` (``blocks.{wait}.hook_resid_post``) is ablated at every position but
  BOS (position 0): CAMA by default, or the plain-mean / zero baselines; ``wait=-1``: no ablation;
* in blocks ``wait+1 .. wait+transfer`` the last token sees every earlier token (full peek) while every
  other token sees only BOS and itself (self peek);
* in every later block all tokens self-peek.

``wait`` ranges over ``-1 .. n_layers-1`` and ``transfer`` over ``0 .. n_layers-1-wait``.

Selection rule: among the configurations with faithfulness ``>= threshold``, the one with the largest
``wait``; ties broken by the smallest ``transfer``. ``None`` when no configuration is sufficient.

Two evaluation methods give the same numbers:

* ``method="naive"``: one complete intervened forward pass per configuration (``faithfulness`` with
  ``af1_subgraph``), the reference.
* ``method="fast"``: exact shortcuts. (1) CAMA / mean / zero ablation make blocks ``0..wait`` unnecessary:
  the residual after block ``wait`` is a table lookup of the cached means, with the model's own BOS
  state at position 0 (BOS only attends to itself, so its state is the same in every prompt). (2) The
  configurations of one ``wait`` share their transfer blocks: the residual after ``transfer = T`` blocks
  is extended by one block for ``T + 1``. (3) After the transfer blocks every token self-peeks, so the
  last position depends only on itself and BOS, and BOS's state (hence its key and value) is the same
  in every prompt and configuration: the remaining blocks run on the last position alone, with BOS's
  key and value supplied as a frozen key-value cache (``tail="last"``; ``tail="pair"`` runs ``[BOS,
  last]``). That is exact for learned absolute positions (already in the residual) and for rotary
  embeddings, whose last-position query and key are rotated to their true position ``n_pos-1``
  (``hook_rot_q``/``hook_rot_k``); other position schemes (ALiBi, local attention, ...) keep every
  position (``tail="full"``). Only the last position is unembedded. (4) With ``transfer = 0`` the answer depends only on
  the last token (its ablated state is a cached mean, a constant or an embedding) and BOS: one prompt per
  distinct last token is evaluated.

Both backends run the fast method through ``interventions.adapt(model).run_from`` (blocks from a given
residual). ``tail="last"`` and the rotary re-rotation of ``tail="pair"`` read HookedTransformer's
key-value cache and rotary tables, so a ``TransformerBridge`` uses ``tail="pair"`` for learned absolute
positions and ``tail="full"`` for rotary ones (same numbers, more work per tail).

``grid="full"`` evaluates every configuration; ``grid="auto"`` scans waits from the largest down,
each with transfers from 0 upward, stops a wait at its first sufficient transfer and stops descending
after the first wait that has one. Faithfulness need not be monotone in ``transfer``, but the rule only
needs (a) every configuration of the waits above the selected one (all evaluated, none sufficient) and
(b) the transfers below the selected one in its wait (all evaluated): the selection equals the full
grid's.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

import interventions as iv
from circuits.faithfulness import FaithfulnessResult, last_token_metrics, summarize
from interventions.types import Tokens
from interventions.validation import check_choice, check_tokens
from circuits.runs import dist_version, tokens_sha256

ABLATIONS = ("cama", "mean", "zero")
GRIDS = ("auto", "full")
METHODS = ("fast", "naive")
NOT_EVALUATED = "not evaluated"

Config = tuple[int, int]


# --- configurations and the selection rule --------------------------------------------------------
def check_config(n_layers: int, wait: int, transfer: int) -> None:
    """Raise ``ValueError`` unless ``-1 <= wait <= n_layers-1`` and ``0 <= transfer <= n_layers-1-wait``."""
    if not isinstance(wait, int) or not -1 <= wait <= n_layers - 1:
        raise ValueError(f"wait={wait!r} is out of range: valid -1..{n_layers - 1} (-1 = no ablation)")
    if not isinstance(transfer, int) or not 0 <= transfer <= n_layers - 1 - wait:
        raise ValueError(f"transfer={transfer!r} is out of range for wait={wait}: valid 0..{n_layers - 1 - wait}")


def configurations(n_layers: int) -> list[Config]:
    """Every ``(wait, transfer)`` of a model with ``n_layers`` blocks, waits from the largest down."""
    return [(w, t) for w in range(n_layers - 1, -2, -1) for t in range(n_layers - w)]


def select(faith: Mapping[Config, float], threshold: float) -> Config | None:
    """The selection rule over evaluated configurations: among those with faithfulness ``>=
    threshold`` the largest ``wait``, then the smallest ``transfer``; ``None`` if none."""
    ok = [c for c, f in faith.items() if f >= threshold]
    if not ok:
        return None
    return max(ok, key=lambda c: (c[0], -c[1]))


def smallest_transfers(
    faith: Mapping[Config, float], n_layers: int, threshold: float
) -> dict[int, int | None | str]:
    """Per wait: the smallest sufficient transfer, ``None`` if every transfer of that wait was evaluated
    and none is sufficient, or ``"not evaluated"`` when the evaluated configurations cannot tell."""
    out: dict[int, int | None | str] = {}
    for w in range(n_layers - 1, -2, -1):
        value: int | None | str = None
        for t in range(n_layers - w):
            if (w, t) not in faith:
                value = NOT_EVALUATED
                break
            if faith[(w, t)] >= threshold:
                value = t
                break
        out[w] = value
    return out


# --- results --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigResult:
    """Faithfulness of one configuration. ``faithfulness`` is a fraction of the ``n`` prompts."""

    wait: int
    transfer: int
    faithfulness: float
    ci_low: float
    ci_high: float
    n: int
    n_faithful: int
    mean_answer_prob: float
    mean_logit_diff: float
    ablation: str

    @property
    def config(self) -> Config:
        return (self.wait, self.transfer)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ConfigResult":
        nan = float("nan")
        return cls(
            wait=int(d["wait"]),
            transfer=int(d["transfer"]),
            faithfulness=float(d["faithfulness"]),
            ci_low=nan if d.get("ci_low") is None else float(d["ci_low"]),
            ci_high=nan if d.get("ci_high") is None else float(d["ci_high"]),
            n=int(d["n"]),
            n_faithful=int(d.get("n_faithful", round(float(d["faithfulness"]) * int(d["n"])))),
            mean_answer_prob=float(d.get("mean_answer_prob", nan)),
            mean_logit_diff=float(d.get("mean_logit_diff", nan)),
            ablation=str(d.get("ablation", "cama")),
        )

    @classmethod
    def from_faithfulness(cls, wait: int, transfer: int, r: FaithfulnessResult, ablation: str) -> "ConfigResult":
        return cls(wait=wait, transfer=transfer, ablation=ablation, **r.to_dict())


@dataclass
class SearchResult:
    """Outcome of :func:`search_af1`.

    Attributes:
        n_layers: blocks of the model. ``threshold``: faithfulness needed (fraction).
        results: every evaluated configuration (including ones resumed from ``out_dir``).
        selected: the configuration the selection rule picks, or ``None`` if none is sufficient.
        smallest_transfer: per wait, the smallest sufficient transfer (``None``: none; ``"not
            evaluated"``: the auto grid skipped that wait).
        n_evaluated: configurations computed by this call; ``n_resumed``: read back from ``out_dir``.
        passes: model forward calls made by this call; ``seconds``: wall time of the search.
        base_accuracy: fraction of the given prompts the unmodified model answers correctly;
            ``n_prompts``: prompts kept (answered correctly), the faithfulness denominator.
    """

    n_layers: int
    threshold: float
    ablation: str
    grid: str
    method: str
    results: list[ConfigResult]
    selected: ConfigResult | None
    smallest_transfer: dict[int, int | None | str]
    n_evaluated: int
    n_resumed: int
    passes: int
    seconds: float
    base_accuracy: float
    n_prompts: int
    out_dir: Path | None = None
    interventions: list[dict[str, Any]] = field(default_factory=list)

    def faithfulness_map(self) -> dict[Config, float]:
        return {r.config: r.faithfulness for r in self.results}

    def result(self, wait: int, transfer: int) -> ConfigResult | None:
        return next((r for r in self.results if r.config == (wait, transfer)), None)

    def grid_array(self) -> np.ndarray:
        """``[n_layers+1, n_layers+1]`` faithfulness, row ``wait+1``, column ``transfer``; NaN where
        the configuration does not exist or was not evaluated."""
        a = np.full((self.n_layers + 1, self.n_layers + 1), np.nan)
        for r in self.results:
            a[r.wait + 1, r.transfer] = r.faithfulness
        return a

    def table(self) -> str:
        """A plain-text table: per wait, the smallest sufficient transfer and its faithfulness."""
        faith = self.faithfulness_map()
        lines = [f"{'wait':>5} {'smallest transfer':>18} {'faithfulness':>13}"]
        for w, t in sorted(self.smallest_transfer.items(), reverse=True):
            if isinstance(t, int):
                mark = "  <- selected" if self.selected is not None and self.selected.config == (w, t) else ""
                lines.append(f"{w:>5} {t:>18} {faith[(w, t)]:>13.3f}{mark}")
            else:
                best = max((f for (ww, _), f in faith.items() if ww == w), default=None)
                shown = "none" if t is None else t
                extra = f"(best {best:.3f})" if best is not None else ""
                lines.append(f"{w:>5} {shown:>18} {extra:>13}")
        return "\n".join(lines)

    def summary_line(self) -> str:
        if self.selected is None:
            best = max(self.results, key=lambda r: (r.faithfulness, r.wait, -r.transfer), default=None)
            detail = (
                f"; the most faithful is wait={best.wait}, transfer={best.transfer} at {best.faithfulness:.3f}"
                if best is not None else ""
            )
            return (
                f"no configuration reaches faithfulness {self.threshold:g} "
                f"({len(self.results)} configurations evaluated): selected = None{detail}"
            )
        s = self.selected
        return (
            f"selected wait={s.wait}, transfer={s.transfer}: faithfulness {s.faithfulness:.3f} "
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}] on {s.n} prompts (threshold {self.threshold:g})"
        )


# --- evaluators -----------------------------------------------------------------------------------
PerPrompt = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # correct, answer prob, logit diff


class _Evaluator:
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


class NaiveEvaluator(_Evaluator):
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


class FastEvaluator(_Evaluator):
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


def scan(
    n_layers: int,
    threshold: float,
    grid: str,
    evaluate: Callable[[int, int], ConfigResult],
    *,
    bar: Any = None,
) -> dict[Config, ConfigResult]:
    """Evaluate the configurations the grid needs, waits from the largest down and transfers from 0 up.

    ``grid="full"``: every configuration. ``grid="auto"``: a wait stops at its first sufficient
    transfer (``faithfulness >= threshold``) and no lower wait is evaluated after a wait that has one;
    this is exactly what the selection rule needs (see the module docstring). ``evaluate(wait,
    transfer)`` is called in that order, transfers increasing within a wait.
    """
    check_choice("grid", grid, GRIDS)
    results: dict[Config, ConfigResult] = {}
    for w in range(n_layers - 1, -2, -1):
        found = None
        for t in range(n_layers - w):
            r = evaluate(w, t)
            results[(w, t)] = r
            if bar is not None:
                bar.update(1)
                bar.set_postfix(wait=w, transfer=t, faith=f"{r.faithfulness:.3f}")
            if r.faithfulness >= threshold:
                found = t
                if grid == "auto":
                    break
        if grid == "auto" and found is not None:
            break
    return results


# --- the search -----------------------------------------------------------------------------------
def search_af1(
    model: Any,
    tokens: Tokens,
    answers: Int[torch.Tensor, "batch"],
    *,
    cache: iv.MeanCache | None = None,
    threshold: float = 0.9,
    grid: Literal["auto", "full"] = "auto",
    ablation: Literal["cama", "mean", "zero"] = "cama",
    out_dir: str | Path | None = None,
    seed: int = 0,
    batch_size: int = 128,
    progress: bool = True,
    method: Literal["fast", "naive"] = "fast",
    n_boot: int = 1000,
    meta: Mapping[str, Any] | None = None,
    prompts: Sequence[Mapping[str, Any]] | None = None,
) -> SearchResult:
    """Search the AF1 configurations of ``model`` on ``tokens`` and apply the selection rule.

    Args:
        model: a TransformerLens model (eval mode).
        tokens: ``[batch, pos]`` token ids of one layout, BOS at position 0. Prompts the unmodified
            model gets wrong are dropped first (``base_accuracy`` in the result says how many were kept).
        answers: ``[batch]`` answer token ids.
        cache: the :class:`interventions.MeanCache` for CAMA / mean ablation; fitted on ``tokens``
            (the kept prompts) when ``None`` (and loaded from ``out_dir/means.safetensors`` on resume).
        threshold: faithfulness (fraction in [0, 1]) a configuration needs to be sufficient.
        grid: ``"full"`` evaluates every configuration; ``"auto"`` only what the selection needs.
        ablation: ``"cama"`` (default), ``"mean"`` or ``"zero"`` at ``blocks.{wait}.hook_resid_post``.
        out_dir: if given, results are appended to ``out_dir/results.jsonl`` as they are known, and
            ``prompts.jsonl``, ``means.safetensors``, ``summary.json`` and ``report.html`` are written.
            Re-running into the same directory resumes; a different command raises ``RunMismatchError``.
        seed: seed of the bootstrap confidence intervals (recorded in the run identity).
        batch_size: prompts per forward pass. ``progress``: show tqdm bars.
        method: ``"fast"`` (exact shortcuts) or ``"naive"`` (one full forward pass per configuration).
        n_boot: bootstrap resamples per confidence interval.
        meta: identity of the command (e.g. ``model``, ``task``, ``source``, ``command``); recorded in
            ``run.json`` / ``summary.json``. ``base_accuracy``/``n_checked`` there override the values
            measured on ``tokens`` (the caller filtered earlier). ``command`` is not part of the identity.
        prompts: ``{"prompt", "answer"}`` records aligned with ``tokens`` for ``prompts.jsonl``
            (default: token ids and answer token ids).
    """
    t0 = time.perf_counter()
    check_choice("grid", grid, GRIDS)
    check_choice("ablation", ablation, ABLATIONS)
    check_choice("method", method, METHODS)
    if not isinstance(threshold, (int, float)) or not 0.0 <= float(threshold) <= 1.0:
        raise ValueError(f"threshold={threshold!r} must be a fraction in [0, 1]")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    info = iv.adapt(model).info
    tokens = check_tokens(tokens, d_vocab=info.d_vocab)
    answers = torch.as_tensor(answers, dtype=torch.long)
    if answers.shape != (tokens.shape[0],):
        raise ValueError(
            f"answers must hold one token id per prompt: got shape {tuple(answers.shape)} for {tokens.shape[0]} prompts"
        )
    meta = dict(meta or {})
    n_layers = info.n_layers

    # Base check: keep the prompts the unmodified model answers correctly.
    with torch.inference_mode():
        base_logits = torch.cat([model(tokens[s : s + batch_size])[:, -1].float() for s in range(0, len(tokens), batch_size)])
    keep = last_token_metrics(base_logits, answers)[0].cpu()
    n_given = int(tokens.shape[0])
    tokens, answers = tokens[keep], answers[keep]
    if prompts is not None:
        prompts = [p for p, k in zip(prompts, keep.tolist()) if k]
    if len(tokens) == 0:
        raise ValueError(f"the unmodified model answers none of the {n_given} prompts correctly: nothing to search")
    base_accuracy = float(meta.pop("base_accuracy", keep.float().mean().item()))
    n_checked = int(meta.pop("n_checked", n_given))

    identity = {
        **{k: v for k, v in meta.items() if k != "command"},
        "n_prompts": int(tokens.shape[0]),
        "prompts_sha256": tokens_sha256(tokens, answers),
        "model_signature": {**info.signature(), "fingerprint": iv.adapt(model).fingerprint()},
        "threshold": float(threshold),
        "ablation": ablation,
        "seed": int(seed),
        "n_boot": int(n_boot),
        # A cache fitted here is a function of the model and prompts above; a given one is named by hash.
        "means": None if ablation == "zero" else (cache.sha256 if cache is not None else "fitted on the prompts"),
    }
    run_dir = None
    known: dict[Config, ConfigResult] = {}
    if out_dir is not None:
        from circuits.runs import RunDir

        run_dir = RunDir(out_dir, identity).open()
        for rec in run_dir.load_records():
            r = ConfigResult.from_dict(rec)
            known[r.config] = r
        if prompts is None:
            prompts = [
                {"prompt": " ".join(map(str, row)), "answer": int(a)}
                for row, a in zip(tokens.tolist(), answers.tolist())
            ]
        run_dir.write_jsonl("prompts.jsonl", prompts)

    if ablation in ("cama", "mean") and cache is None:
        saved = Path(out_dir) / "means.safetensors" if out_dir is not None else None
        if saved is not None and saved.exists():
            cache = iv.MeanCache.load(saved)
            cache.check_model(model)
        else:
            cache = iv.MeanCache.fit(model, tokens, batch_size=batch_size, progress=progress)
    if cache is not None:
        cache.check_model(model)
        if out_dir is not None:
            target = Path(out_dir) / "means.safetensors"
            if not target.exists() or iv.MeanCache.load(target).sha256 != cache.sha256:
                cache.save(target)
            else:
                cache.source = str(target)

    evaluator_cls = FastEvaluator if method == "fast" else NaiveEvaluator
    evaluator = evaluator_cls(model, tokens, answers, cache, ablation, batch_size)
    counts = {"evaluated": 0, "resumed": 0}

    def evaluate(w: int, t: int) -> ConfigResult:
        if (w, t) in known:
            counts["resumed"] += 1
            return known[(w, t)]
        res = summarize(*evaluator.evaluate(w, t), n_boot=n_boot, seed=seed)
        r = ConfigResult.from_faithfulness(w, t, res, ablation)
        counts["evaluated"] += 1
        if run_dir is not None:
            run_dir.append(r.to_dict())
        return r

    bar = tqdm(total=len(configurations(n_layers)), desc=f"AF1 search ({grid} grid)", unit="config", disable=not progress)
    try:
        results = scan(n_layers, threshold, grid, evaluate, bar=bar)
    finally:
        bar.close()
    n_evaluated, n_resumed = counts["evaluated"], counts["resumed"]
    # Results resumed from an earlier (e.g. full-grid) run count too: they can only add information.
    for c, r in known.items():
        results.setdefault(c, r)
    faith = {c: r.faithfulness for c, r in results.items()}
    chosen = select(faith, threshold)
    selected = results[chosen] if chosen is not None else None
    specs: list[dict[str, Any]] = []
    if selected is not None:
        specs = [x.to_dict() for x in iv.af1_subgraph(n_layers, selected.wait, selected.transfer, cache, ablation)]
    seconds = time.perf_counter() - t0
    result = SearchResult(
        n_layers=n_layers,
        threshold=float(threshold),
        ablation=ablation,
        grid=grid,
        method=method,
        results=sorted(results.values(), key=lambda r: (-r.wait, r.transfer)),
        selected=selected,
        smallest_transfer=smallest_transfers(faith, n_layers, threshold),
        n_evaluated=n_evaluated,
        n_resumed=n_resumed,
        passes=evaluator.passes,
        seconds=seconds,
        base_accuracy=base_accuracy,
        n_prompts=int(tokens.shape[0]),
        out_dir=Path(out_dir) if out_dir is not None else None,
        interventions=specs,
    )
    if run_dir is not None:
        write_outputs(result, run_dir.path, meta=meta, seed=seed, n_checked=n_checked, identity=identity)
    return result


def write_outputs(
    result: SearchResult,
    out_dir: str | Path,
    *,
    meta: Mapping[str, Any],
    seed: int,
    n_checked: int,
    identity: Mapping[str, Any],
) -> None:
    """``summary.json`` and ``report.html`` of a finished search in ``out_dir``."""
    import transformer_lens

    import circuits
    from circuits import report
    from circuits.runs import write_json

    out_dir = Path(out_dir)
    sel = result.selected
    summary = {
        "model": meta.get("model"),
        "task": meta.get("task"),
        "seed": int(seed),
        "threshold": result.threshold,
        "base_accuracy": result.base_accuracy,
        "n_checked": n_checked,
        "n_prompts": result.n_prompts,
        "selected": None
        if sel is None
        else {"wait": sel.wait, "transfer": sel.transfer, "faithfulness": sel.faithfulness,
              "ci_low": sel.ci_low, "ci_high": sel.ci_high, "n": sel.n},
        "selected_message": result.summary_line(),
        "interventions": result.interventions,
        "seconds": result.seconds,
        "circuits_version": circuits.__version__,
        "transformer_lens_version": getattr(transformer_lens, "__version__", None) or dist_version("transformer-lens"),
        "torch_version": torch.__version__,
        "smallest_transfer_per_wait": {str(w): t for w, t in sorted(result.smallest_transfer.items())},
        "grid": result.grid,
        "method": result.method,
        "ablation": result.ablation,
        "n_layers": result.n_layers,
        "n_configs_total": len(configurations(result.n_layers)),
        "n_configs_evaluated": len(result.results),
        "n_evaluated_this_run": result.n_evaluated,
        "n_resumed": result.n_resumed,
        "passes": result.passes,
        "command": list(meta.get("command") or sys.argv),
        "identity": dict(identity),
        "source": meta.get("source"),
        "means": "means.safetensors" if (out_dir / "means.safetensors").exists() else None,
    }
    write_json(out_dir / "summary.json", summary)
    title = f"AF1 search: {meta.get('model') or 'model'} on {meta.get('task') or 'prompts'} ({result.ablation})"
    report.search_report(result, out_dir / "report.html", title=title)


def load_summary(out_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a finished search directory."""
    import json

    path = Path(out_dir) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"no summary.json in {out_dir}: the search has not finished there")
    return json.loads(path.read_text())

