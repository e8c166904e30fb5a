"""Attention interchange check: patch the last-position attention output from a counterfactual prompt.

Replace ``blocks.{l}.hook_attn_out`` at the last position by its value on a counterfactual prompt (one
operand or the operator changed, same layout) and measure the drop of the original answer's
probability, one block at a time (:func:`interchange`). Counterfactual pairs come from
:mod:`circuits.lens.counterfactual`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Int

import interventions as iv
from circuits.errors import ArgumentError
from interventions.adapter import attn_out
from interventions.hooks import HookPointLike
from interventions.types import Figure, JsonDict, Model
from interventions.validation import check_tokens

from .capture import block_list, capture_last
from .jsonable import json_ready

__all__ = ["InterchangeResult", "interchange"]


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
        """``[n, n_layers]``: ``clean_prob - patched_prob`` per prompt and patched block."""
        return self.clean_prob[:, None] - self.patched_prob

    def rows(self) -> list[JsonDict]:
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
                assert self.counter_top1 is not None  # written together with counter_prob
                row["counter_prob"] = float(self.counter_prob[:, j].mean())
                row["counter_top1"] = float(self.counter_top1[:, j].mean())
            out.append(row)
        return out

    def plot(self) -> Figure:
        """The report's bar chart of the mean drop per patched block, with its 95% interval (a plotly figure;
        ``af1 lens`` draws every interchange of a run into one)."""
        from circuits.lens.figures import interchange_figure

        return interchange_figure([self])

    def to_dict(self) -> JsonDict:
        """JSON-ready ``{"label", "n", "rows"}`` (:meth:`rows`, NaN as None)."""
        return json_ready({"label": self.label, "n": int(len(self.clean_prob)), "rows": self.rows()})


def _token_ids(what: str, ids: Any, n: int) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.shape != (n,):
        raise ArgumentError(f"{what} must hold one token id per prompt: got {ids.numel()} for {n} prompts")
    return ids


@torch.inference_mode()
def interchange(
    model: Model,
    tokens: Int[torch.Tensor, "batch pos"],
    answers: Int[torch.Tensor, " batch"],
    counter_tokens: Int[torch.Tensor, "batch pos"],
    *,
    counter_answers: Int[torch.Tensor, " batch"] | None = None,
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
    ``len(layers) + 1`` passes per batch. Probabilities are softmax over the full vocabulary at the last
    position (float32).
    """
    ad = iv.adapt(model)
    tokens = check_tokens(tokens, d_vocab=ad.info.d_vocab)
    counter_tokens = check_tokens(counter_tokens, d_vocab=ad.info.d_vocab)
    if tokens.shape != counter_tokens.shape:
        raise ArgumentError(
            f"counter_tokens must have the layout of tokens: shapes {tuple(counter_tokens.shape)} and "
            f"{tuple(tokens.shape)} differ"
        )
    answers = _token_ids("answers", answers, tokens.shape[0])
    if counter_answers is not None:
        counter_answers = _token_ids("counter_answers", counter_answers, tokens.shape[0])
    layers = block_list(ad, layers)
    device = ad.device()
    from tqdm.auto import tqdm

    clean, patched, top1, cprob, ctop1 = [], [], [], [], []
    names = [attn_out(layer) for layer in layers]
    for start in tqdm(range(0, tokens.shape[0], batch_size), desc=f"interchange {label}".strip(),
                      disable=not progress):
        sl = slice(start, start + batch_size)
        toks, ctoks, ans = tokens[sl].to(device), counter_tokens[sl].to(device), answers[sl].to(device)
        store = capture_last(ad, names, lambda: model(ctoks))  # noqa: B023 (called at once, in this iteration)
        logits = model(toks)[:, -1].float()
        clean.append(logits.softmax(-1).gather(-1, ans[:, None])[:, 0].cpu())
        bp, bt, bcp, bct = [], [], [], []
        for n in names:
            src = store[n]

            def patch(act: torch.Tensor, hook: HookPointLike | None = None, src: torch.Tensor = src) -> torch.Tensor:
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
