"""Faithfulness: how often the intervened model still gives the unmodified model's correct answer.

Faithfulness = accuracy (argmax at the last position equals the answer token) of the intervened model
on the prompts that the *unmodified* model answers correctly. Alongside it: a 95% bootstrap confidence
interval over prompts, the mean probability of the answer token, and the mean logit difference between
the answer and the best other token of the whole vocabulary (negative = wrong), so near-misses show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int

import interventions as iv
from circuits.errors import ArgumentError
from circuits.validation import check_positive
from interventions.types import InterventionError, JsonDict, Model, Tokens
from interventions.validation import check_answers, check_tokens


@dataclass(frozen=True)
class FaithfulnessResult:
    """Faithfulness of one intervention set on ``n`` prompts (all answered correctly by the base model).

    ``faithfulness`` is a fraction in [0, 1]; ``ci_low``/``ci_high`` bound its 95% bootstrap interval;
    ``mean_answer_prob`` is a probability; ``mean_logit_diff`` is in logits (answer minus best other).
    """

    faithfulness: float
    n: int
    n_faithful: int
    ci_low: float
    ci_high: float
    mean_answer_prob: float
    mean_logit_diff: float

    def to_dict(self) -> JsonDict:
        return asdict(self)


def last_token_metrics(
    last_logits: Float[torch.Tensor, "batch *k d_vocab"], answers: Int[torch.Tensor, " batch *k"]
) -> tuple[Bool[torch.Tensor, " batch"], Float[torch.Tensor, " batch"], Float[torch.Tensor, " batch"]]:
    """Per prompt: argmax == answer, probability of the answer, answer logit minus best other logit.

    ``last_logits`` ``[batch, d_vocab]`` with ``answers`` ``[batch]``; or, for answers of ``k`` tokens read
    under teacher forcing, ``[batch, k, d_vocab]`` with ``[batch, k]``: correct when every answer token is the
    argmax of its position, the probability of the whole answer (the product over its tokens) and the
    smallest margin among its tokens (:func:`interventions.readout.readout_metrics`, the same rule)."""
    if answers.ndim == 2:
        b, k = answers.shape
        correct, prob, diff = last_token_metrics(last_logits.reshape(b * k, -1), answers.reshape(b * k))
        return (correct.reshape(b, k).all(dim=1), prob.reshape(b, k).prod(dim=1),
                diff.reshape(b, k).min(dim=1).values)
    logits = last_logits.float()
    answers = answers.to(logits.device)
    answer_logit = logits.gather(-1, answers[:, None]).squeeze(-1)
    others = logits.scatter(-1, answers[:, None], float("-inf"))
    correct = logits.argmax(-1) == answers
    prob = logits.softmax(-1).gather(-1, answers[:, None]).squeeze(-1)
    return correct, prob, answer_logit - others.max(-1).values


def bootstrap_ci(values: np.ndarray, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampling prompts)."""
    if len(values) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    means = values[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def summarize(
    correct: Bool[torch.Tensor, " batch"],
    prob: Float[torch.Tensor, " batch"],
    logit_diff: Float[torch.Tensor, " batch"],
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> FaithfulnessResult:
    """Aggregate per-prompt metrics (of base-correct prompts) into a :class:`FaithfulnessResult`."""
    check_positive("n_boot", n_boot)
    c = correct.detach().cpu().numpy().astype(np.float64)
    if len(c) == 0:
        raise InterventionError("no prompts to evaluate: the base model answered none of them correctly")
    lo, hi = bootstrap_ci(c, n_boot=n_boot, seed=seed)
    return FaithfulnessResult(
        faithfulness=float(c.mean()),
        n=len(c),
        n_faithful=int(c.sum()),
        ci_low=lo,
        ci_high=hi,
        mean_answer_prob=float(prob.float().mean()),
        mean_logit_diff=float(logit_diff.float().mean()),
    )


@torch.inference_mode()
def last_logits(
    model: Model, tokens: Tokens, interventions: Sequence[iv.Intervention] = (), *, batch_size: int = 128,
    n_answer: int = 1,
) -> Float[torch.Tensor, "batch *k d_vocab"]:
    """Logits at the last position of every prompt (``[batch, d_vocab]``), under ``interventions``, in batches;
    with ``n_answer = k > 1`` at the last ``k`` positions (``[batch, k, d_vocab]``, an answer of ``k`` tokens
    read under teacher forcing)."""
    out = []
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size]
        # The last position only (on a backend that runs several batches per pass, only it comes back).
        if n_answer == 1:
            out.append(iv.run_many(model, [(batch, list(interventions))])[0][:, -1].float())
        else:
            out.append(iv.run_many(model, [(batch, list(interventions))], logits="all")[0][:, -n_answer:].float())
    return torch.cat(out)


def answer_width(answers: Int[torch.Tensor, " batch *k"]) -> int:
    """Answer tokens per prompt: 1 for ``[batch]`` answers, ``k`` for ``[batch, k]``."""
    return 1 if answers.ndim == 1 else int(answers.shape[1])


def answer_logits(model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"],
                  interventions: Sequence[iv.Intervention] = (), *,
                  batch_size: int = 128) -> Float[torch.Tensor, "batch *k d_vocab"]:
    """:func:`last_logits` at the positions that predict ``answers`` (``[batch]`` or ``[batch, k]``)."""
    return last_logits(model, tokens, interventions, batch_size=batch_size, n_answer=answer_width(answers))


def base_correct(model: Model, tokens: Tokens, answers: Int[torch.Tensor, " batch *k"], *,
                 batch_size: int = 128) -> Bool[torch.Tensor, " batch"]:
    """Which prompts the unmodified model answers correctly (argmax at the last position; for ``[batch, k]``
    answers, every answer token the argmax of its position under teacher forcing)."""
    correct, _, _ = last_token_metrics(answer_logits(model, tokens, answers, batch_size=batch_size), answers)
    return correct.cpu()


def faithfulness(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    interventions: Sequence[iv.Intervention],
    *,
    assume_correct: bool = False,
    batch_size: int = 128,
    n_boot: int = 1000,
    seed: int = 0,
) -> FaithfulnessResult:
    """Faithfulness of ``interventions`` on prompts ``tokens`` (one layout) with answer ids ``answers``.

    Prompts the unmodified model gets wrong are dropped first (skip that check with
    ``assume_correct=True`` when the caller already filtered). ``n`` in the result counts the kept
    prompts.
    """
    d_vocab = iv.adapt(model).info.d_vocab
    tokens = check_tokens(tokens, d_vocab=d_vocab)
    answers = check_answers(answers, int(tokens.shape[0]), d_vocab)
    check_positive("batch_size", batch_size)
    check_positive("n_boot", n_boot)
    if not assume_correct:
        keep = base_correct(model, tokens, answers, batch_size=batch_size)
        tokens, answers = tokens[keep], answers[keep]
        if len(tokens) == 0:
            raise InterventionError("the unmodified model answers none of these prompts correctly")
    metrics = last_token_metrics(answer_logits(model, tokens, answers, interventions, batch_size=batch_size), answers)
    return summarize(*metrics, n_boot=n_boot, seed=seed)


def prompt_faithfulness(
    model: Model,
    tokens: Tokens,
    answers: Int[torch.Tensor, " batch"],
    interventions: Sequence[iv.Intervention],
    *,
    assume_correct: bool = False,
    batch_size: int = 128,
    prompts: Sequence[str] | None = None,
) -> Any:
    """:func:`faithfulness` prompt by prompt: a :class:`~circuits.store.outcomes.PromptOutcomes` (which prompts keep
    their answer, the answer's probability and its margin over the best other token). Prompts the unmodified
    model gets wrong are dropped first (``assume_correct=True`` skips that check); ``index`` says which of the
    given prompts each row is, ``prompts`` (their text, aligned with ``tokens``) labels the rows."""
    from circuits.store.outcomes import PromptOutcomes

    d_vocab = iv.adapt(model).info.d_vocab
    tokens = check_tokens(tokens, d_vocab=d_vocab)
    answers = check_answers(answers, int(tokens.shape[0]), d_vocab)
    check_positive("batch_size", batch_size)
    if prompts is not None and len(prompts) != len(tokens):
        raise ArgumentError(f"prompts has {len(prompts)} texts for {len(tokens)} prompts")
    index = torch.arange(len(tokens))
    if not assume_correct:
        keep = base_correct(model, tokens, answers, batch_size=batch_size)
        tokens, answers, index = tokens[keep], answers[keep], index[keep]
        if len(tokens) == 0:
            raise InterventionError("the unmodified model answers none of these prompts correctly")
    metrics = last_token_metrics(answer_logits(model, tokens, answers, interventions, batch_size=batch_size), answers)
    texts = [prompts[i] for i in index.tolist()] if prompts is not None else None
    out = PromptOutcomes.from_metrics(*metrics, prompts=texts)
    out.index = index.numpy()
    return out

