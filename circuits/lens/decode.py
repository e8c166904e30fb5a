"""Early decoding (logit lens): project last-position states to the vocabulary and score them.

Decoding (:func:`decode_states`):

* ``decode="final_norm"`` (default): apply the model's own final normalisation ``model.ln_final`` and
  unembedding ``model.unembed`` (``W_U``, ``b_U``). For LayerNorm (and RMSNorm) the normalisation scale is
  **recomputed on the decoded state**, as the logit lens usually does; with folded LayerNorm
  (``LayerNormPre``) the folded weights live in ``W_U``, so this is again exactly the model's final path.
  A model without a final norm decodes as ``raw``.
* ``decode="raw"``: unembedding only (``resid @ W_U + b_U``), no normalisation.

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

:func:`early_decode` streams over batches and keeps only the last-position vectors it decodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int

import interventions as iv
from circuits.validation import check_choice, check_positive
from circuits.vocab import DECODES
from interventions.types import Model

from .capture import block_list, lens_states, sublayers_of
from .inputs import prompt_groups
from .numeric import NumericTable, numeric_table
from .result import LensResult

__all__ = ["decode_states", "early_decode"]


@torch.inference_mode()
def decode_states(
    model: Model, resid: Float[torch.Tensor, "batch d_model"], decode: str = "final_norm"
) -> Float[torch.Tensor, "batch d_vocab"]:
    """Logits (float32) of residual states: ``unembed(ln_final(resid))`` or ``unembed(resid)`` (raw)."""
    check_choice("decode", decode, DECODES)
    x = resid[:, None, :]
    if decode == "final_norm" and getattr(model, "ln_final", None) is not None:  # no final norm: identity
        x = model.ln_final(x)
    return model.unembed(x)[:, 0].float()


def _metrics(
    logits: Float[torch.Tensor, "batch d_vocab"],
    answers: Int[torch.Tensor, " batch"],
    answer_values: Float[torch.Tensor, " batch"],
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


def early_decode(
    model: Model,
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

    Returns:
        A :class:`LensResult` (numpy arrays ``[n_prompts, n_layers, n_sublayers]``; metrics in the
        module docstring).
    """
    check_choice("decode", decode, DECODES)
    check_positive("top_k", top_k)
    check_positive("batch_size", batch_size)
    ad = iv.adapt(model)
    layers = block_list(ad, layers)
    if table is None:
        table = numeric_table(model, numeric_values=numeric_values, token_strings=token_strings,
                              operator_ids=operator_ids)
    groups = prompt_groups(model, dataset_or_tokens, table=table, answers=answers,
                           answer_values=answer_values, prompts=prompts)

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
            batch: dict[str, list[torch.Tensor]] = {}
            for layer in layers:
                per_sub: dict[str, list[torch.Tensor]] = {}
                for sub in subs:
                    logits = decode_states(model, states[(layer, sub)], decode)
                    m = _metrics(logits, ans, vals[sl], table, full_track[sl], top_k)
                    for k, v in m.items():
                        per_sub.setdefault(k, []).append(v.cpu())
                for k, subs_k in per_sub.items():
                    batch.setdefault(k, []).append(torch.stack(subs_k, 1))
            for k, layers_k in batch.items():
                chunks.setdefault(k, []).append(torch.stack(layers_k, 1).numpy())
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
