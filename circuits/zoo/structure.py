"""A ground-truth AF1 structure: which (block, head, query, key) attention links a model may use, the
training-time hooks that enforce it (hard mask and/or a penalty on the scores of forbidden keys) and the
measurement of the attention mass forbidden keys receive in a plain forward pass.

Conventions: blocks are 0-indexed; ``wait`` is the index of the last waiting block (-1: none);
the transfer blocks are ``wait+1 .. wait+transfer``; BOS is at position 0; "last" is the final position
of the token tensor (one layout per batch, no right padding). A structure allows:

* every non-last query position: BOS (key 0) and itself, in every block and head;
* the last position: in the transfer blocks, through the designated heads ``heads[i]`` of transfer block
  ``wait+1+i``, the keys of that head's *window* (plus BOS and itself); BOS and itself in every other
  (block, head).

Windows (:data:`WINDOWS`; ``n`` = prompt length, BOS at 0, the last token at ``n-1``; the Original tasks
are ``A op B =`` and ``A op B op C =``): ``"all"`` = every earlier key; ``"first"`` = keys ``1 .. n-4``
(every operand and operator before the last operator: ``A`` or ``A op1 B``); ``"last"`` = keys ``n-3 ..
n-2`` (the last operator and the last operand). Giving two heads disjoint windows makes each of them
necessary (it is the only reader of its keys), so the planted head set is minimal by construction.

Everything else is a *forbidden* key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from circuits.errors import ArgumentError

if TYPE_CHECKING:
    import torch
    from jaxtyping import Bool, Int

    from interventions.types import JsonDict, Model  # torch is imported only where a model is

__all__ = ["WINDOWS", "Structure", "window_keys", "allowed_mask", "ScoreHooks", "forbidden_mass"]

WINDOWS = ("all", "first", "last")


def window_keys(window: str, seq_len: int) -> list[int]:
    """Key positions (0-indexed, BOS and the last position excluded) of ``window`` in a prompt of
    ``seq_len`` tokens (see the module docstring)."""
    if window == "all":
        return list(range(1, seq_len - 1))
    if window == "first":
        return list(range(1, seq_len - 3))
    if window == "last":
        return list(range(max(1, seq_len - 3), seq_len - 1))
    raise ArgumentError(f"unknown window {window!r}; known: {', '.join(WINDOWS)}")


@dataclass(frozen=True)
class Structure:
    """A planted AF1 structure: ``wait`` (last waiting block, 0-indexed), ``transfer`` (number of
    transfer blocks), ``heads`` (one tuple of head indices per transfer block, in block order) and
    ``windows`` (the window of each of those heads, same shape; ``None``: every head ``"all"``)."""

    wait: int
    transfer: int
    heads: tuple[tuple[int, ...], ...]
    windows: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.transfer < 1 or len(self.heads) != self.transfer:
            raise ArgumentError(f"structure needs transfer >= 1 and one head tuple per transfer block, got "
                                f"transfer={self.transfer}, heads={self.heads}")
        windows = self.windows if self.windows is not None else tuple(tuple("all" for _ in hs) for hs in self.heads)
        object.__setattr__(self, "windows", windows)
        if [len(w) for w in windows] != [len(h) for h in self.heads] or any(
                w not in WINDOWS for ws in windows for w in ws):
            raise ArgumentError(f"structure windows {self.windows} must name one of {WINDOWS} per head {self.heads}")

    def window(self, block: int, head: int) -> str | None:
        """The window of designated head ``(block, head)``, ``None`` if it is not designated."""
        assert self.windows is not None  # filled in by __post_init__
        for b, hs, ws in zip(self.blocks, self.heads, self.windows):
            if b == block and head in hs:
                return ws[hs.index(head)]
        return None

    @property
    def blocks(self) -> list[int]:
        """The transfer blocks ``wait+1 .. wait+transfer`` (0-indexed)."""
        return list(range(self.wait + 1, self.wait + 1 + self.transfer))

    @property
    def head_set(self) -> set[tuple[int, int]]:
        """The designated heads as ``(block, head)`` pairs."""
        return {(b, h) for b, hs in zip(self.blocks, self.heads) for h in hs}

    def to_dict(self) -> JsonDict:
        """JSON form: ``{"wait": w, "transfer": t, "heads": {"<block>": [heads]}, "windows": {"<block>":
        [windows]}}``."""
        assert self.windows is not None  # filled in by __post_init__
        return {"wait": self.wait, "transfer": self.transfer,
                "heads": {str(b): list(hs) for b, hs in zip(self.blocks, self.heads)},
                "windows": {str(b): list(ws) for b, ws in zip(self.blocks, self.windows)}}

    @classmethod
    def from_dict(cls, d: JsonDict) -> Structure:
        """Inverse of :meth:`to_dict`."""
        w, t = int(d["wait"]), int(d["transfer"])
        blocks = [str(b) for b in range(w + 1, w + 1 + t)]
        windows = tuple(tuple(d["windows"][b]) for b in blocks) if "windows" in d else None
        return cls(w, t, tuple(tuple(int(h) for h in d["heads"][b]) for b in blocks), windows)

    def check(self, n_layers: int, n_heads: int) -> None:
        """``ValueError`` unless the transfer blocks and heads exist in a model of this size."""
        if self.wait < -1 or self.wait + self.transfer > n_layers - 1:
            raise ArgumentError(f"structure wait={self.wait}, transfer={self.transfer} does not fit {n_layers} blocks")
        if any(not 0 <= h < n_heads for hs in self.heads for h in hs):
            raise ArgumentError(f"structure heads {self.heads} out of range for {n_heads} heads")


def allowed_mask(structure: Structure, n_layers: int, n_heads: int,
                 seq_len: int) -> Bool[torch.Tensor, "n_layers n_heads seq_len seq_len"]:
    """Boolean ``[n_layers, n_heads, seq_len, seq_len]`` (query, key): True where ``structure`` allows the
    link (causal links only)."""
    import torch

    q = torch.arange(seq_len)[:, None]
    k = torch.arange(seq_len)[None, :]
    base = ((k == 0) | (k == q)) & (k <= q)
    out = base.expand(n_layers, n_heads, seq_len, seq_len).clone()
    for b, h in structure.head_set:
        window = structure.window(b, h)
        assert window is not None  # (b, h) is a designated head
        out[b, h, -1, window_keys(window, seq_len)] = True
    return out


class ScoreHooks:
    """Forward hooks on every ``blocks.{l}.attn.hook_attn_scores`` of a ``HookedTransformer`` that (1) add
    to :attr:`penalty` the mean over batch rows of the hinge ``relu(s_f - logsumexp(s_allowed) + margin)``
    summed over forbidden keys ``f``, divided by the number of forbidden (layer, head, query, key) links
    (so it is the mean hinge per link, in score units), and (2) while :attr:`hard` is true, set forbidden
    scores to -inf (the structure holds exactly), else subtract :attr:`bias` (score units) from them (a soft
    mask, for annealing into the hard one). A forbidden key whose score is ``margin`` below the
    allowed keys' log-sum-exp gets at most ``exp(-margin)`` of the row's attention."""

    def __init__(self, model: Model, structure: Structure, margin: float = 10.0, hard: bool = True, bias: float = 0.0):
        structure.check(model.cfg.n_layers, model.cfg.n_heads)
        self.model, self.structure, self.margin, self.hard, self.bias = model, structure, margin, hard, bias
        self.penalty: torch.Tensor | None = None
        self._masks: dict[int, Any] = {}

    def mask(self, seq_len: int):
        if seq_len not in self._masks:
            self._masks[seq_len] = allowed_mask(self.structure, self.model.cfg.n_layers, self.model.cfg.n_heads,
                                                seq_len)
        return self._masks[seq_len]

    def hook(self, layer: int):
        import torch

        def body(scores, hook):
            allowed = self.mask(scores.shape[-1])[layer]
            n = scores.shape[-1]
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            forbidden = causal & ~allowed
            lse = scores.masked_fill(~allowed, float("-inf")).logsumexp(-1, keepdim=True)
            hinge = torch.relu(scores - lse + self.margin).masked_fill(~forbidden, 0.0)
            n_links = max(1, int(forbidden.sum())) * self.model.cfg.n_layers
            term = hinge.sum(dim=(1, 2, 3)).mean() / n_links
            self.penalty = term if self.penalty is None else self.penalty + term
            if self.hard:
                return scores.masked_fill(forbidden, float("-inf"))
            return scores - self.bias * forbidden if self.bias else scores

        return body

    def hooks(self) -> list[tuple[str, Any]]:
        """``(hook name, function)`` pairs for ``model.hooks(fwd_hooks=...)``."""
        return [(f"blocks.{layer}.attn.hook_attn_scores", self.hook(layer)) for layer in range(self.model.cfg.n_layers)]

    def reset(self) -> None:
        """Forget the penalty of the last forward pass."""
        self.penalty = None


def forbidden_mass(model: Model, structure: Structure, tokens: Int[torch.Tensor, "batch pos"],
                   batch_size: int = 512) -> dict:
    """Attention that forbidden keys receive in a plain forward pass of ``model`` (a ``HookedTransformer``,
    no hooks added) on ``tokens`` ``[batch, pos]`` (one layout). Returns ``max_key`` (largest pattern entry
    of any forbidden key, a fraction of its row), ``max_row`` (largest summed forbidden mass of a query
    row) and ``per_layer`` (``max_key`` per block)."""
    import torch

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    forbidden = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril() & ~allowed_mask(
        structure, n_layers, n_heads, tokens.shape[1])
    per_layer = [0.0] * n_layers
    max_row = 0.0
    names = {f"blocks.{layer}.attn.hook_pattern": layer for layer in range(n_layers)}
    with torch.no_grad():
        for i in range(0, len(tokens), batch_size):
            _, cache = model.run_with_cache(tokens[i: i + batch_size], names_filter=lambda n: n in names)
            for name, layer in names.items():
                f = cache[name] * forbidden[layer]
                per_layer[layer] = max(per_layer[layer], float(f.max()))
                max_row = max(max_row, float(f.sum(-1).max()))
    return {"max_key": max(per_layer), "max_row": max_row, "per_layer": per_layer}
