"""Early decoding (logit lens) after every attention and MLP sub-layer, and the attention interchange check.

Early decoding reads the residual stream at the **last prompt position** after each sub-layer of every
block and projects it to the vocabulary as if it were the final state:

* ``decode="final_norm"`` (default): apply the model's own final normalisation ``model.ln_final`` and
  unembedding ``model.unembed`` (``W_U``, ``b_U``). For LayerNorm (and RMSNorm) the normalisation scale is
  **recomputed on the decoded state**, as the logit lens usually does; with folded LayerNorm
  (``LayerNormPre``) the folded weights live in ``W_U``, so this is again exactly the model's final path.
* ``decode="raw"``: unembedding only (``resid @ W_U + b_U``), no normalisation.

Which state is decoded (blocks 0-indexed):

* Sequential blocks (GPT-2, Llama, ...): post-attention = ``blocks.{l}.hook_resid_mid``, post-MLP =
  ``blocks.{l}.hook_resid_post``.
* Parallel blocks (GPT-NeoX/Pythia, GPT-J: ``cfg.parallel_attn_mlp``) have no ``hook_resid_mid``;
  post-attention = ``hook_resid_pre + hook_attn_out``; post-MLP = ``hook_resid_post`` (= pre + attn + mlp).
* Attention-only models have one sub-layer per block (``"attn"`` = ``hook_resid_post``).

Decoding the final block's post-MLP state with ``final_norm`` reproduces the model's logits.

Metrics, per prompt and (block, sub-layer), computed on the decoded logits at the last position:

* ``answer_prob``: softmax probability of the answer token; ``answer_rank``: number of vocabulary
  tokens with a strictly larger logit (0 = top-1).
* ``numeric_mass``: total probability of numeric tokens (tokens whose stripped text is an integer).
* ``top1_numeric``: 1 if the top-1 token is numeric; ``top10_numeric``: share of numeric tokens among
  the top-10 (always 10, or the vocabulary size if smaller).
* ``abs_error``: ``|value(top numeric token) - answer value|`` where the top numeric token is the
  highest-ranked numeric token; NaN when the answer value is unknown or the vocabulary has no number.
* visibility of tracked prompt tokens: 1 if the token is among the ``top_k`` decoded tokens. Tracked are
  the prompt's numeric tokens (``operand1``, ``operand2``, ... in prompt order, which is not always the
  task's A, B order) and operator tokens (``operator1``, ...; text ``+`` or ``-``).

Interchange check (second seed paper): replace ``blocks.{l}.hook_attn_out`` at the last position by its
value on a counterfactual prompt (one operand or the operator changed, same layout) and measure the drop
of the original answer's probability, one block at a time (:func:`interchange`).

Every pass streams over batches and keeps only the last-position vectors of the hooks it decodes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from jaxtyping import Bool, Float, Int

import interventions as iv
from interventions.adapter import ModelAdapter, attn_out, resid_mid, resid_post, resid_pre
from interventions.validation import check_tokens

__all__ = [
    "DECODES", "METRICS", "SUBLAYERS", "NumericTable", "numeric_table", "LensResult", "early_decode",
    "decode_states", "lens_states", "sublayer_hooks", "InterchangeResult", "interchange",
    "CounterfactualSet", "counterfactual_rows", "counterfactual_set", "parse_operands", "answer_token_id",
    "json_ready",
]

DECODES = ("final_norm", "raw")
SUBLAYERS = ("attn", "mlp")
METRICS = ("answer_prob", "answer_rank", "numeric_mass", "top1_numeric", "top10_numeric", "abs_error")
OPERATOR_TEXTS = ("+", "-")
_INT_RE = re.compile(r"-?[0-9]+")


# --------------------------------------------------------------------------------------------------
# numeric-token table
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NumericTable:
    """Which vocabulary ids are numbers (and their integer values) and which are operators.

    ``mask[i]`` is True when token ``i``'s stripped text is an integer; ``values[i]`` is that integer
    (0 elsewhere); ``operators`` maps operator token ids to their text (``"+"`` / ``"-"``).
    """

    mask: Bool[torch.Tensor, "d_vocab"]
    values: Int[torch.Tensor, "d_vocab"]
    operators: dict[int, str] = field(default_factory=dict)

    @property
    def n_numeric(self) -> int:
        return int(self.mask.sum())

    def value(self, token_id: int) -> int | None:
        """Integer value of ``token_id``, or None if it is not numeric."""
        return int(self.values[token_id]) if bool(self.mask[token_id]) else None


def _table_from_strings(strings: Sequence[str | None], d_vocab: int) -> NumericTable:
    mask = torch.zeros(d_vocab, dtype=torch.bool)
    values = torch.zeros(d_vocab, dtype=torch.long)
    ops: dict[int, str] = {}
    for i, s in enumerate(strings[:d_vocab]):
        if s is None:
            continue
        s = s.strip()
        if _INT_RE.fullmatch(s):
            mask[i], values[i] = True, int(s)
        elif s in OPERATOR_TEXTS:
            ops[i] = s
    return NumericTable(mask, values, ops)


def numeric_table(
    model: Any,
    *,
    numeric_values: Mapping[int, int] | None = None,
    token_strings: Sequence[str | None] | None = None,
    operator_ids: Mapping[int, str] | None = None,
) -> NumericTable:
    """Build the numeric-token table of ``model`` once.

    Sources, first given wins: ``numeric_values`` (``{token_id: integer}``; other ids are not numeric),
    ``token_strings`` (the text of every id, index = id), else the model's tokenizer: every id is
    decoded on its own (``tokenizer.batch_decode``), so GPT-2 style ``'Ġ42'`` reads ``' 42'`` and
    SentencePiece ``'▁42'`` reads ``'42'``; a token whose stripped text matches ``-?[0-9]+`` is numeric.
    ``operator_ids`` (``{token_id: "+" | "-"}``) overrides the operator tokens found in the strings.

    Raises ``ValueError`` when the model has no tokenizer and neither table is given.
    """
    d_vocab = int(model.cfg.d_vocab)
    if numeric_values is not None:
        mask = torch.zeros(d_vocab, dtype=torch.bool)
        values = torch.zeros(d_vocab, dtype=torch.long)
        for tid, val in numeric_values.items():
            if not 0 <= int(tid) < d_vocab:
                raise ValueError(f"numeric_values has token id {tid}: valid ids are 0..{d_vocab - 1}")
            mask[int(tid)], values[int(tid)] = True, int(val)
        table = NumericTable(mask, values, {})
    elif token_strings is not None:
        table = _table_from_strings(list(token_strings), d_vocab)
    else:
        tok = getattr(model, "tokenizer", None)
        if tok is None:
            raise ValueError(
                "this model has no tokenizer: pass numeric_values={token_id: integer} (and operator_ids) "
                "or token_strings=[text of id 0, text of id 1, ...]"
            )
        n = min(d_vocab, len(tok))
        table = _table_from_strings(tok.batch_decode([[i] for i in range(n)]), d_vocab)
    if operator_ids is not None:
        for tid, text in operator_ids.items():
            if not 0 <= int(tid) < d_vocab:
                raise ValueError(f"operator_ids has token id {tid}: valid ids are 0..{d_vocab - 1}")
        table = NumericTable(table.mask, table.values, {int(k): str(v) for k, v in operator_ids.items()})
    return table


# --------------------------------------------------------------------------------------------------
# states and decoding
# --------------------------------------------------------------------------------------------------
def sublayers_of(model: Any) -> tuple[str, ...]:
    """Sub-layers decoded per block: ``("attn", "mlp")``, or ``("attn",)`` for attention-only models."""
    return ("attn",) if getattr(model.cfg, "attn_only", False) else SUBLAYERS


def sublayer_hooks(model: Any, layer: int) -> dict[str, tuple[str, ...]]:
    """Hook names whose last-position sum is the state after each sub-layer of block ``layer``."""
    if getattr(model.cfg, "attn_only", False):
        return {"attn": (resid_post(layer),)}
    if getattr(model.cfg, "parallel_attn_mlp", False):
        return {"attn": (resid_pre(layer), attn_out(layer)), "mlp": (resid_post(layer),)}
    return {"attn": (resid_mid(layer),), "mlp": (resid_post(layer),)}


def capture_last(ad: ModelAdapter, names: Sequence[str], forward: Any) -> dict[str, torch.Tensor]:
    """Run ``forward()`` with hooks copying the last position (``act[:, -1]``) of each hook in
    ``names``; returns ``{name: [batch, ...]}`` for the hooks that fired, keyed by the names asked for
    (a bridge's hook point may carry its own, aliased name)."""
    store: dict[str, torch.Tensor] = {}

    def grabber(name: str) -> Any:
        def grab(act: torch.Tensor, hook: Any = None) -> None:
            store[name] = act[:, -1].detach().clone()

        return grab

    with ad.hooks([(name, grabber(name)) for name in names]):
        forward()
    return store


@torch.inference_mode()
def lens_states(
    model: Any, tokens: Int[torch.Tensor, "batch pos"], layers: Sequence[int] | None = None
) -> dict[tuple[int, str], Float[torch.Tensor, "batch d_model"]]:
    """Residual states at the last position after every sub-layer of ``layers`` (default: all blocks).

    One forward pass (without the final unembedding); hooks copy only ``act[:, -1]``. Keys are
    ``(layer, sublayer)``.
    """
    ad: ModelAdapter = iv.adapt(model)
    layers = list(range(ad.info.n_layers)) if layers is None else list(layers)
    for layer in layers:
        ad.info.check_layer(layer)
    plan = {(layer, sub): names for layer in layers for sub, names in sublayer_hooks(model, layer).items()}
    names = sorted({n for ns in plan.values() for n in ns})
    store = capture_last(ad, names, lambda: ad.run_to_resid(tokens))
    missing = [n for n in names if n not in store]
    if missing:
        raise RuntimeError(f"hooks {missing} did not fire: this architecture is not supported by the lens")
    states = {}
    for key, ns in plan.items():
        state = store[ns[0]]
        for n in ns[1:]:  # parallel blocks: resid_pre + attn_out
            state = state + store[n]
        states[key] = state
    return states


@torch.inference_mode()
def decode_states(
    model: Any, resid: Float[torch.Tensor, "batch d_model"], decode: str = "final_norm"
) -> Float[torch.Tensor, "batch d_vocab"]:
    """Logits (float32) of residual states: ``unembed(ln_final(resid))`` or ``unembed(resid)`` (raw)."""
    if decode not in DECODES:
        raise ValueError(f"decode={decode!r} is not valid: choose one of {', '.join(map(repr, DECODES))}")
    x = resid[:, None, :]
    if decode == "final_norm" and getattr(model, "ln_final", None) is not None:  # no final norm: identity
        x = model.ln_final(x)
    return model.unembed(x)[:, 0].float()


# --------------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------------
def _metrics(
    logits: Float[torch.Tensor, "batch d_vocab"],
    answers: Int[torch.Tensor, "batch"],
    answer_values: Float[torch.Tensor, "batch"],
    table: NumericTable,
    track: Int[torch.Tensor, "batch n_track"],
    top_k: int,
) -> dict[str, torch.Tensor]:
    """Per-prompt metrics of one (block, sub-layer); see the module docstring."""
    d_vocab = logits.shape[-1]
    mask = table.mask.to(logits.device)
    values = table.values.to(logits.device)
    probs = logits.softmax(-1)
    ans_logit = logits.gather(-1, answers[:, None])
    k = min(max(10, top_k), d_vocab)
    top = logits.topk(k, dim=-1).indices
    top10 = top[:, : min(10, d_vocab)]
    out = {
        "answer_prob": probs.gather(-1, answers[:, None])[:, 0],
        "answer_rank": (logits > ans_logit).sum(-1).float(),
        "numeric_mass": (probs * mask).sum(-1),
        "top1_numeric": mask[top[:, 0]].float(),
        "top10_numeric": mask[top10].float().mean(-1),
        "top1_token": top[:, 0].float(),
    }
    if table.n_numeric:
        best_num = logits.masked_fill(~mask, float("-inf")).argmax(-1)
        out["abs_error"] = (values[best_num].float() - answer_values.to(logits.device)).abs()
    else:
        out["abs_error"] = torch.full_like(out["answer_prob"], float("nan"))
    topk = top[:, : min(top_k, d_vocab)]
    tr = track.to(logits.device)
    vis = (topk[:, :, None] == tr[:, None, :]).any(1).float()
    out["visible"] = vis.masked_fill(tr < 0, float("nan"))
    return out


def _tracked_tokens(tokens: torch.Tensor, table: NumericTable) -> tuple[list[str], torch.Tensor]:
    """Tracked prompt tokens of one layout: positions whose token is numeric (resp. an operator) in
    every prompt, after BOS. Returns names (``operand1``.., ``operator1``..) and ids ``[batch, n]``."""
    body = tokens[:, 1:].cpu()
    is_num = table.mask[body].all(0)
    op_ids = torch.tensor(sorted(table.operators), dtype=torch.long)
    is_op = torch.isin(body, op_ids).all(0) if len(op_ids) else torch.zeros(body.shape[1], dtype=torch.bool)
    num_pos = torch.nonzero(is_num).flatten().tolist()
    op_pos = torch.nonzero(is_op).flatten().tolist()
    names = [f"operand{i + 1}" for i in range(len(num_pos))] + [f"operator{i + 1}" for i in range(len(op_pos))]
    cols = [body[:, p] for p in num_pos + op_pos]
    ids = torch.stack(cols, 1) if cols else torch.zeros((body.shape[0], 0), dtype=torch.long)
    return names, ids


# --------------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------------
@dataclass
class LensResult:
    """Per-prompt early-decoding metrics.

    Arrays are numpy, shaped ``[n_prompts, n_layers, n_sublayers]`` (``visible``:
    ``[n_prompts, n_layers, n_sublayers, n_tracked]``), in the order of ``prompts``/``answers``.
    ``layers`` are 0-indexed block indices; ``sublayers`` is ``("attn", "mlp")`` (post-attention,
    post-MLP). Probabilities and shares in [0, 1]; ranks 0 = top-1; ``abs_error`` in answer units (NaN
    where the answer value is unknown); ``visible`` is NaN where a prompt lacks that tracked token.
    """

    layers: list[int]
    sublayers: tuple[str, ...]
    decode: str
    top_k: int
    answers: np.ndarray
    answer_values: np.ndarray
    prompts: list[str]
    layout_lengths: np.ndarray
    answer_prob: np.ndarray
    answer_rank: np.ndarray
    numeric_mass: np.ndarray
    top1_numeric: np.ndarray
    top10_numeric: np.ndarray
    abs_error: np.ndarray
    top1_token: np.ndarray
    tracked: list[str]
    visible: np.ndarray

    @property
    def n_prompts(self) -> int:
        return int(self.answer_prob.shape[0])

    def labels(self) -> list[str]:
        """Depth labels in forward order: ``["L0 attn", "L0 mlp", "L1 attn", ...]``."""
        return [f"L{layer} {sub}" for layer in self.layers for sub in self.sublayers]

    def flat(self, metric: str) -> np.ndarray:
        """``[n_prompts, n_layers * n_sublayers]`` view of a metric, columns in :meth:`labels` order."""
        arr = getattr(self, metric)
        return arr.reshape(arr.shape[0], -1, *arr.shape[3:])

    def rows(self, *, n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
        """One summary row per (block, sub-layer), in forward order.

        Keys: ``layer``, ``sublayer``, ``label``, each metric of :data:`METRICS` (mean over prompts,
        NaN-skipping) with ``<metric>_std`` (population std) and ``<metric>_ci_low`` / ``_ci_high`` (95%
        percentile bootstrap over prompts, one shared resampling), ``answer_top1`` (share of prompts
        with rank 0), ``answer_rank_median``, ``visible_<name>`` (share of prompts with that tracked
        token in the top-k) and ``n``.
        """
        n = self.n_prompts
        idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n)) if n else None
        rows = []
        for li, layer in enumerate(self.layers):
            for si, sub in enumerate(self.sublayers):
                row: dict[str, Any] = {"layer": int(layer), "sublayer": sub, "label": f"L{layer} {sub}", "n": n}
                for m in METRICS:
                    v = getattr(self, m)[:, li, si].astype(np.float64)
                    row.update(_summary(m, v, idx))
                rank = self.answer_rank[:, li, si]
                row["answer_top1"] = float(np.mean(rank == 0)) if n else float("nan")
                row["answer_rank_median"] = float(np.median(rank)) if n else float("nan")
                for ti, name in enumerate(self.tracked):
                    v = self.visible[:, li, si, ti]
                    row[f"visible_{name}"] = float(np.nanmean(v)) if np.isfinite(v).any() else None
                rows.append(row)
        return rows

    def to_dict(self, *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
        """JSON-ready summary: ``prompts`` (``[{"prompt", "answer"}]``, answer = integer value or None),
        ``answer_tokens`` (answer token ids, same order), ``rows`` (:meth:`rows`) and the settings."""
        prompts = [{"prompt": p, "answer": _json_num(a)} for p, a in zip(self.prompts, self.answer_values)]
        return {
            "decode": self.decode, "top_k": self.top_k, "layers": list(map(int, self.layers)),
            "sublayers": list(self.sublayers), "tracked": list(self.tracked), "n_prompts": self.n_prompts,
            "prompts": prompts, "answer_tokens": [int(t) for t in self.answers],
            "rows": json_ready(self.rows(n_boot=n_boot, seed=seed)),
        }


def _json_num(x: float) -> int | float | None:
    x = float(x)
    if math.isnan(x):
        return None
    return int(x) if x.is_integer() else x


def json_ready(obj: Any) -> Any:
    """NaN/inf -> None, recursively, so ``json.dumps`` writes strict JSON."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_ready(v) for v in obj]
    return obj


def _summary(name: str, v: np.ndarray, idx: np.ndarray | None) -> dict[str, float]:
    ok = np.isfinite(v)
    if idx is None or not ok.any():
        nan = float("nan")
        return {name: nan, f"{name}_std": nan, f"{name}_ci_low": nan, f"{name}_ci_high": nan}
    if ok.all():
        means = v[idx].mean(1)
    else:  # NaN-skipping bootstrap: resample prompts, average the finite ones
        vals, w = np.where(ok, v, 0.0)[idx], ok[idx]
        with np.errstate(invalid="ignore"):
            means = vals.sum(1) / w.sum(1)
        means = means[np.isfinite(means)]
    return {
        name: float(v[ok].mean()), f"{name}_std": float(v[ok].std()),
        f"{name}_ci_low": float(np.quantile(means, 0.025)), f"{name}_ci_high": float(np.quantile(means, 0.975)),
    }


# --------------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------------
@dataclass
class _Group:
    """Prompts of one layout (a private stand-in with the fields of ``tasks.Layout``)."""

    tokens: torch.Tensor
    answers: torch.Tensor
    prompts: list[str]
    answer_values: list[float]
    indices: list[int]


def answer_token_id(model: Any, answer: Any) -> int:
    """The single token id of ``answer`` (text or integer) as it follows the prompt; ``ValueError``
    naming the answer and its pieces when it is several tokens."""
    toks = model.to_tokens(str(answer), prepend_bos=False)[0]
    if toks.numel() != 1:
        pieces = [model.to_string(t[None]) for t in toks]
        raise ValueError(
            f"answer {answer!r} is not a single token: it splits into {toks.numel()} pieces {pieces}; "
            f"early decoding reads one next token, drop such prompts (e.g. tasks.filter_single_token)"
        )
    return int(toks[0])


def _answer_ids(model: Any, answers: Any, n: int) -> torch.Tensor:
    if isinstance(answers, torch.Tensor):
        ids = answers.long().flatten().cpu()
    else:
        ids = torch.tensor([answer_token_id(model, a) for a in answers], dtype=torch.long)
    if ids.shape != (n,):
        raise ValueError(f"answers must hold one answer per prompt: got {ids.numel()} for {n} prompts")
    d_vocab = int(model.cfg.d_vocab)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= d_vocab):
        raise ValueError(f"answer token id out of range: valid ids are 0..{d_vocab - 1}")
    return ids


def _stack_one_layout(items: Sequence[torch.Tensor]) -> torch.Tensor:
    lengths = sorted({int(t.numel()) for t in items})
    if len(lengths) > 1:
        raise ValueError(
            f"prompts of mixed layout: token lengths {lengths}; tokens must be one layout (one length, no "
            f"padding). Pass a dataset (grouped by layout) or split the prompts by length"
        )
    return torch.stack([t.flatten().long() for t in items])


def _is_dataset(obj: Any) -> bool:
    if hasattr(obj, "column_names"):
        return True
    return isinstance(obj, (list, tuple)) and len(obj) > 0 and isinstance(obj[0], Mapping)


def _dataset_groups(model: Any, ds: Any) -> list[_Group]:
    """Group a dataset (columns ``prompt`` and ``answer``) by layout, largest layout first."""
    try:
        from circuits import tasks

        to_layouts = getattr(tasks, "to_layouts", None)
    except ImportError:  # circuits.tasks not available yet
        to_layouts = None
    if to_layouts is not None and hasattr(ds, "column_names"):
        rows_ans = list(ds["answer"])
        for a in sorted(set(rows_ans), key=str):
            answer_token_id(model, a)  # clear multi-token error before grouping
        out = []
        for lay in to_layouts(model, ds):
            out.append(_Group(lay.tokens, torch.as_tensor(lay.answers).long(), list(lay.prompts),
                              [float(x) for x in lay.answer_values], list(lay.indices)))
        return out
    # Private fallback (used until circuits.tasks.to_layouts exists; same grouping rule).
    rows = list(ds) if not hasattr(ds, "column_names") else ds.to_list()
    by_len: dict[int, list[tuple[int, torch.Tensor, int, dict]]] = {}
    for i, r in enumerate(rows):
        toks = model.to_tokens(r["prompt"])[0].cpu()
        aid = answer_token_id(model, r["answer"])
        by_len.setdefault(toks.numel(), []).append((i, toks, aid, r))
    groups = []
    for _, items in sorted(by_len.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        groups.append(_Group(
            torch.stack([t for _, t, _, _ in items]), torch.tensor([a for _, _, a, _ in items]),
            [r["prompt"] for *_, r in items], [_as_value(r["answer"]) for *_, r in items],
            [i for i, *_ in items],
        ))
    return groups


def _as_value(x: Any) -> float:
    try:
        return float(int(str(x).strip()))
    except ValueError:
        return float("nan")


# --------------------------------------------------------------------------------------------------
# early decoding
# --------------------------------------------------------------------------------------------------
def early_decode(
    model: Any,
    dataset_or_tokens: Any,
    *,
    answers: Any = None,
    answer_values: Sequence[float] | None = None,
    prompts: Sequence[str] | None = None,
    decode: str = "final_norm",
    top_k: int = 10,
    batch_size: int = 64,
    layers: Sequence[int] | None = None,
    numeric_values: Mapping[int, int] | None = None,
    token_strings: Sequence[str | None] | None = None,
    operator_ids: Mapping[int, str] | None = None,
    table: NumericTable | None = None,
    progress: bool = True,
) -> LensResult:
    """Early decoding at the last position after every attention and MLP sub-layer.

    Args:
        model: a TransformerLens model.
        dataset_or_tokens: either token ids of **one layout** (``Long[batch, pos]`` with BOS at position
            0, or a list of equally long 1-D tensors; mixed lengths raise ``ValueError``), or a dataset
            (``datasets.Dataset`` or list of dicts with ``prompt`` and integer ``answer``), which is
            grouped by layout (``tasks.to_layouts``) and **every layout is processed**; results are
            concatenated, largest layout first (``LensResult.prompts`` gives the order).
        answers: with tokens only: answer token ids (``LongTensor[batch]``) or a sequence of answer
            texts/integers, tokenised as the text following the prompt (must be single tokens).
        answer_values: integer values of the answers (for ``abs_error``); default: the numeric value of
            the answer token (NaN if it is not numeric).
        prompts: optional prompt texts for the tokens input (default: ``model.to_string`` if possible).
        decode: ``"final_norm"`` (``ln_final`` then unembed) or ``"raw"`` (unembed only).
        top_k: k of the operand/operator visibility test (``top10_numeric`` always uses 10).
        batch_size: prompts per forward pass.
        layers: blocks to decode (0-indexed), default all.
        numeric_values, token_strings, operator_ids, table: numeric-token table (see
            :func:`numeric_table`); required for models without a tokenizer.
        progress: show a tqdm bar over batches.
    """
    if decode not in DECODES:
        raise ValueError(f"decode={decode!r} is not valid: choose one of {', '.join(map(repr, DECODES))}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r} must be an integer >= 1")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    ad = iv.adapt(model)
    layers = list(range(ad.info.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        ad.info.check_layer(layer)
    if table is None:
        table = numeric_table(model, numeric_values=numeric_values, token_strings=token_strings,
                              operator_ids=operator_ids)

    if _is_dataset(dataset_or_tokens):
        if answers is not None:
            raise ValueError("answers come from the dataset's 'answer' column: do not pass answers too")
        groups = _dataset_groups(model, dataset_or_tokens)
    else:
        obj = dataset_or_tokens
        if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], torch.Tensor):
            obj = _stack_one_layout(obj)
        if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], str):
            obj = _stack_one_layout([model.to_tokens(p)[0] for p in obj])
        tokens = check_tokens(obj, d_vocab=ad.info.d_vocab).cpu()
        if answers is None:
            raise ValueError("answers are required with a tokens input (one answer per prompt)")
        ids = _answer_ids(model, answers, tokens.shape[0])
        if prompts is None:
            prompts = _to_strings(model, tokens)
        elif len(prompts) != tokens.shape[0]:
            raise ValueError(f"prompts has {len(prompts)} entries for {tokens.shape[0]} prompts")
        if answer_values is None:
            vals = [float(table.value(int(a))) if table.value(int(a)) is not None else float("nan") for a in ids]
        else:
            vals = [float(v) for v in answer_values]
            if len(vals) != tokens.shape[0]:
                raise ValueError(f"answer_values has {len(vals)} entries for {tokens.shape[0]} prompts")
        groups = [_Group(tokens, ids, list(prompts), vals, list(range(tokens.shape[0])))]

    subs = sublayers_of(model)
    tracked: list[str] = []
    per_group = []
    for g in groups:
        names, ids = _tracked_tokens(g.tokens, table)
        per_group.append((names, ids))
        tracked += [n for n in names if n not in tracked]

    total = sum(len(g.prompts) for g in groups)
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="early decoding", unit="prompt", disable=not progress)
    device = ad.device()
    chunks: dict[str, list[np.ndarray]] = {}
    for g, (names, track_ids) in zip(groups, per_group):
        col = [names.index(t) if t in names else -1 for t in tracked]
        full_track = torch.stack(
            [track_ids[:, c] if c >= 0 else torch.full((len(g.prompts),), -1, dtype=torch.long) for c in col], 1
        ) if tracked else torch.zeros((len(g.prompts), 0), dtype=torch.long)
        vals = torch.tensor(g.answer_values, dtype=torch.float32)
        for start in range(0, len(g.prompts), batch_size):
            sl = slice(start, start + batch_size)
            toks = g.tokens[sl].to(device)
            ans = g.answers[sl].to(device)
            states = lens_states(model, toks, layers)
            batch: dict[str, list[list[torch.Tensor]]] = {}
            for layer in layers:
                per_sub: dict[str, list[torch.Tensor]] = {}
                for sub in subs:
                    logits = decode_states(model, states[(layer, sub)], decode)
                    m = _metrics(logits, ans, vals[sl], table, full_track[sl], top_k)
                    for k, v in m.items():
                        per_sub.setdefault(k, []).append(v.cpu())
                for k, v in per_sub.items():
                    batch.setdefault(k, []).append(torch.stack(v, 1))
            for k, v in batch.items():
                chunks.setdefault(k, []).append(torch.stack(v, 1).numpy())
            bar.update(toks.shape[0])
    bar.close()

    arrays = {k: np.concatenate(v) for k, v in chunks.items()}
    return LensResult(
        layers=layers, sublayers=subs, decode=decode, top_k=top_k,
        answers=np.concatenate([g.answers.numpy() for g in groups]),
        answer_values=np.concatenate([np.asarray(g.answer_values, dtype=np.float64) for g in groups]),
        prompts=[p for g in groups for p in g.prompts],
        layout_lengths=np.concatenate([np.full(len(g.prompts), g.tokens.shape[1]) for g in groups]),
        answer_prob=arrays["answer_prob"], answer_rank=arrays["answer_rank"].astype(np.int64),
        numeric_mass=arrays["numeric_mass"], top1_numeric=arrays["top1_numeric"],
        top10_numeric=arrays["top10_numeric"], abs_error=arrays["abs_error"],
        top1_token=arrays["top1_token"].astype(np.int64), tracked=tracked, visible=arrays["visible"],
    )


def _to_strings(model: Any, tokens: torch.Tensor) -> list[str]:
    if getattr(model, "tokenizer", None) is None:
        return [" ".join(str(int(t)) for t in row[1:]) for row in tokens]
    return [model.to_string(row[1:]) for row in tokens]


# --------------------------------------------------------------------------------------------------
# interchange
# --------------------------------------------------------------------------------------------------
@dataclass
class InterchangeResult:
    """Per-block effect of patching ``blocks.{l}.hook_attn_out[:, -1]`` from the counterfactual prompt.

    ``clean_prob``: ``[n]`` probability of the original answer, unpatched. ``patched_prob``: ``[n,
    n_layers]`` the same after patching block ``layers[j]``. ``drop = clean_prob - patched_prob``
    (positive = the patch removes the answer). ``counter_prob`` / ``counter_top1``: probability of the
    counterfactual answer after the patch, and whether it became the argmax (None without
    ``counter_answers``). ``orig_top1``: whether the original answer is still the argmax.
    """

    layers: list[int]
    clean_prob: np.ndarray
    patched_prob: np.ndarray
    orig_top1: np.ndarray
    counter_prob: np.ndarray | None
    counter_top1: np.ndarray | None
    label: str = ""

    @property
    def drop(self) -> np.ndarray:
        return self.clean_prob[:, None] - self.patched_prob

    def rows(self) -> list[dict[str, Any]]:
        """One row per block: ``layer``, ``drop`` (mean), ``drop_std``, ``drop_ci_low/high`` (normal 95%),
        ``patched_prob``, ``answer_top1`` (share still top-1), ``counter_prob``, ``counter_top1``."""
        n = len(self.clean_prob)
        out = []
        for j, layer in enumerate(self.layers):
            d = self.drop[:, j]
            half = 1.96 * d.std(ddof=1) / math.sqrt(n) if n > 1 else float("nan")
            row = {
                "layer": int(layer), "n": n, "clean_prob": float(self.clean_prob.mean()),
                "drop": float(d.mean()), "drop_std": float(d.std()),
                "drop_ci_low": float(d.mean() - half), "drop_ci_high": float(d.mean() + half),
                "patched_prob": float(self.patched_prob[:, j].mean()),
                "answer_top1": float(self.orig_top1[:, j].mean()),
            }
            if self.counter_prob is not None:
                row["counter_prob"] = float(self.counter_prob[:, j].mean())
                row["counter_top1"] = float(self.counter_top1[:, j].mean())
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        return json_ready({"label": self.label, "n": int(len(self.clean_prob)), "rows": self.rows()})


@torch.inference_mode()
def interchange(
    model: Any,
    tokens: Int[torch.Tensor, "batch pos"],
    answers: Int[torch.Tensor, "batch"],
    counter_tokens: Int[torch.Tensor, "batch pos"],
    *,
    counter_answers: Int[torch.Tensor, "batch"] | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 64,
    label: str = "",
    progress: bool = True,
) -> InterchangeResult:
    """Interchange the attention output at the last position, one block at a time.

    For each block ``l`` of ``layers`` (default all, 0-indexed), run ``tokens`` with
    ``blocks.{l}.hook_attn_out[:, -1]`` replaced by its value on ``counter_tokens`` (the same row of a
    counterfactual prompt of the same layout, e.g. one operand or the operator changed) and record the
    probability of the original answer ``answers`` (token ids). Cost: one counterfactual pass plus
    ``len(layers) + 1`` passes per batch.
    """
    ad = iv.adapt(model)
    tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)
    counter_tokens = check_tokens(counter_tokens, d_vocab=ad.info.d_vocab)
    if tokens.shape != counter_tokens.shape:
        raise ValueError(
            f"counter_tokens must have the layout of tokens: shapes {tuple(counter_tokens.shape)} and "
            f"{tuple(tokens.shape)} differ"
        )
    answers = torch.as_tensor(answers, dtype=torch.long).flatten()
    if answers.shape != (tokens.shape[0],):
        raise ValueError(f"answers must hold one token id per prompt: got {answers.numel()} for {tokens.shape[0]}")
    if counter_answers is not None:
        counter_answers = torch.as_tensor(counter_answers, dtype=torch.long).flatten()
        if counter_answers.shape != answers.shape:
            raise ValueError(f"counter_answers has {counter_answers.numel()} entries for {tokens.shape[0]} prompts")
    layers = list(range(ad.info.n_layers)) if layers is None else [int(x) for x in layers]
    for layer in layers:
        ad.info.check_layer(layer)
    device = ad.device()
    from tqdm.auto import tqdm

    clean, patched, top1, cprob, ctop1 = [], [], [], [], []
    names = [attn_out(layer) for layer in layers]
    for start in tqdm(range(0, tokens.shape[0], batch_size), desc=f"interchange {label}".strip(),
                      disable=not progress):
        sl = slice(start, start + batch_size)
        toks, ctoks, ans = tokens[sl].to(device), counter_tokens[sl].to(device), answers[sl].to(device)
        store = capture_last(ad, names, lambda: model(ctoks))
        logits = model(toks)[:, -1].float()
        clean.append(logits.softmax(-1).gather(-1, ans[:, None])[:, 0].cpu())
        bp, bt, bcp, bct = [], [], [], []
        for layer, n in zip(layers, names):
            src = store[n]

            def patch(act: torch.Tensor, hook: Any = None, src: torch.Tensor = src) -> torch.Tensor:
                act = act.clone()
                act[:, -1] = src.to(act.dtype)
                return act

            with ad.hooks([(n, patch)]):
                out = model(toks)[:, -1].float()
            probs = out.softmax(-1)
            bp.append(probs.gather(-1, ans[:, None])[:, 0].cpu())
            bt.append((out.argmax(-1) == ans).cpu())
            if counter_answers is not None:
                ca = counter_answers[sl].to(device)
                bcp.append(probs.gather(-1, ca[:, None])[:, 0].cpu())
                bct.append((out.argmax(-1) == ca).cpu())
        patched.append(torch.stack(bp, 1))
        top1.append(torch.stack(bt, 1))
        if counter_answers is not None:
            cprob.append(torch.stack(bcp, 1))
            ctop1.append(torch.stack(bct, 1))
    return InterchangeResult(
        layers=layers, clean_prob=torch.cat(clean).numpy().astype(np.float64),
        patched_prob=torch.cat(patched).numpy().astype(np.float64),
        orig_top1=torch.cat(top1).numpy(),
        counter_prob=torch.cat(cprob).numpy().astype(np.float64) if cprob else None,
        counter_top1=torch.cat(ctop1).numpy() if ctop1 else None,
        label=label,
    )


# --------------------------------------------------------------------------------------------------
# counterfactual prompts
# --------------------------------------------------------------------------------------------------
def _flip_template(template: str, expression: str, index: int) -> tuple[str, str]:
    """Flip the ``index``-th ``+``/``-`` of ``template`` (outside placeholders) and of ``expression``."""
    def flip_nth(text: str, skip_braces: bool) -> str | None:
        count, depth = 0, 0
        for i, ch in enumerate(text):
            if skip_braces and ch == "{":
                depth += 1
            elif skip_braces and ch == "}":
                depth -= 1
            elif depth == 0 and ch in "+-":
                if count == index:
                    return text[:i] + ("-" if ch == "+" else "+") + text[i + 1:]
                count += 1
        return None

    t, e = flip_nth(template, True), flip_nth(expression, False)
    if t is None or e is None:
        raise ValueError(
            f"cannot flip operator {index}: template {template!r} / expression {expression!r} has no "
            f"operator symbol at that index (only templates with '+'/'-' symbols can be flipped)"
        )
    return t, e


def parse_operands(template: str, operand_names: Sequence[str], prompt: str) -> list[int] | None:
    """Operands of ``prompt`` read back through ``template`` (e.g. ``"{A}+{B}="``), in
    ``operand_names`` order; None if the prompt does not match the template."""
    pattern, pos = "", 0
    for m in re.finditer(r"\{([A-Za-z_]\w*)\}", template):
        pattern += re.escape(template[pos:m.start()]) + f"(?P<{m.group(1)}>-?[0-9]+)"
        pos = m.end()
    match = re.fullmatch(pattern + re.escape(template[pos:]), prompt)
    if match is None:
        return None
    return [int(match.group(n)) for n in operand_names]


def _eval_expression(expression: str, names: Sequence[str], operands: Sequence[int]) -> int:
    idx = {k: i for i, k in enumerate(names)}
    total = 0
    for sign, var in re.findall(r"([+-]?)\s*([A-Z])", expression):
        total = total - operands[idx[var]] if sign == "-" else total + operands[idx[var]]
    return int(total)


def counterfactual_rows(
    ds: Any, *, change: str = "operand", index: int = 0, seed: int = 0, spec: Any = None
) -> list[dict[str, Any]]:
    """Counterfactual prompt texts for a task dataset (columns ``prompt``, ``answer``, ``operands``,
    ``task``), one per row that admits one.

    ``change="operand"``: operand ``index`` (task order A, B, C; 0-indexed) is replaced by another value
    of its range, drawn with ``numpy.random.default_rng(seed)``, preferring values with the same number
    of digits (so the layout usually stays the same); the new answer must lie in the task's answer range.
    ``change="operator"``: the ``index``-th ``+``/``-`` symbol of the template is flipped; rows whose new
    answer is negative or above the task's maximum are dropped.

    ``spec`` (a ``tasks.TaskSpec``: template, expression, operand_names, operand_ranges, answer_min,
    answer_max) defaults to ``tasks.get_task(row["task"])``. Returns dicts with ``prompt``, ``answer``,
    ``operands``, ``counter_prompt``, ``counter_answer``, ``counter_operands``, ``row`` (input index).
    """
    if change not in ("operand", "operator"):
        raise ValueError(f"change={change!r} is not valid: choose 'operand' or 'operator'")
    rows = ds.to_list() if hasattr(ds, "to_list") else list(ds)
    rng = np.random.default_rng(seed)
    specs: dict[str, Any] = {}
    out = []
    for i, r in enumerate(rows):
        sp = spec
        if sp is None:
            name = r["task"]
            if name not in specs:
                from circuits import tasks

                specs[name] = tasks.get_task(name)
            sp = specs[name]
        ops = [int(x) for x in r["operands"]]
        names = tuple(sp.operand_names)
        if change == "operand":
            if not 0 <= index < len(ops):
                raise ValueError(f"index={index} is out of range: the task has operands 0..{len(ops) - 1}")
            lo, hi = sp.operand_ranges[index]
            cands = []
            for v in range(int(lo), int(hi) + 1):
                if v == ops[index]:
                    continue
                new = ops.copy()
                new[index] = v
                a = _eval_expression(sp.expression, names, new)
                if sp.answer_min <= a <= sp.answer_max:
                    cands.append((v, new, a))
            same = [c for c in cands if len(str(c[0])) == len(str(ops[index]))]
            pool = same or cands
            if not pool:
                continue
            v, new, a = pool[int(rng.integers(len(pool)))]
            counter_prompt = sp.template.format(**dict(zip(names, new)))
            out.append({"prompt": r["prompt"], "answer": int(r["answer"]), "operands": ops,
                        "counter_prompt": counter_prompt, "counter_answer": a, "counter_operands": new, "row": i})
        else:
            template, expression = _flip_template(sp.template, sp.expression, index)
            a = _eval_expression(expression, names, ops)
            if not 0 <= a <= sp.answer_max:
                continue
            out.append({"prompt": r["prompt"], "answer": int(r["answer"]), "operands": ops,
                        "counter_prompt": template.format(**dict(zip(names, ops))), "counter_answer": a,
                        "counter_operands": ops, "row": i})
    return out


@dataclass
class CounterfactualSet:
    """Pairs of prompts of one layout for :func:`interchange` (tokens with BOS at position 0)."""

    tokens: Int[torch.Tensor, "batch pos"]
    answers: Int[torch.Tensor, "batch"]
    counter_tokens: Int[torch.Tensor, "batch pos"]
    counter_answers: Int[torch.Tensor, "batch"]
    prompts: list[str]
    counter_prompts: list[str]
    n_dropped: int
    label: str = ""


def counterfactual_set(model: Any, pairs: Iterable[Mapping[str, Any]], *, label: str = "") -> CounterfactualSet:
    """Tokenise counterfactual pairs (:func:`counterfactual_rows`) and keep only same-layout pairs:
    both prompts have the same token length, both answers are single tokens, and the pair belongs to the
    most common layout. ``n_dropped`` counts the rest. ``ValueError`` if no pair is left."""
    kept: dict[int, list[tuple]] = {}
    n_in = 0
    for p in pairs:
        n_in += 1
        a = model.to_tokens(p["prompt"])[0].cpu()
        b = model.to_tokens(p["counter_prompt"])[0].cpu()
        if a.numel() != b.numel():
            continue
        try:
            ai, bi = answer_token_id(model, p["answer"]), answer_token_id(model, p["counter_answer"])
        except ValueError:
            continue
        kept.setdefault(a.numel(), []).append((a, b, ai, bi, p["prompt"], p["counter_prompt"]))
    if not kept:
        raise ValueError(f"no counterfactual pair of the same layout among {n_in} pairs ({label or 'unnamed'})")
    _, items = max(kept.items(), key=lambda kv: (len(kv[1]), -kv[0]))
    return CounterfactualSet(
        tokens=torch.stack([x[0] for x in items]), answers=torch.tensor([x[2] for x in items]),
        counter_tokens=torch.stack([x[1] for x in items]), counter_answers=torch.tensor([x[3] for x in items]),
        prompts=[x[4] for x in items], counter_prompts=[x[5] for x in items], n_dropped=n_in - len(items),
        label=label,
    )
