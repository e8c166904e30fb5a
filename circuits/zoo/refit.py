"""The last step of every zoo recipe: the unembedding refitted without a bias, so that a model folder is a
plain Hugging Face checkpoint.

A ``HookedTransformer`` is trained with an unembedding bias ``b_U``; ``GPT2LMHeadModel`` and
``LlamaForCausalLM`` have none on ``lm_head``. Every other weight stays as trained; the unembedding
``W_U`` (``lm_head.weight``, untied from the embedding) is refitted so that the model without ``b_U``
computes what the model with it computed, on the prompts it was trained on (the answer position of
every training task of the recipe, as :func:`circuits.zoo.data.build_splits` gives them):

1. **Fold.** ``W_U + beta b_U^T``, where ``beta`` is the least-squares solution of ``h . beta = 1`` over the
   final-normed residuals ``h``, adds ``(h . beta) b_U`` to the logits: exactly ``b_U`` wherever
   ``h . beta = 1``. After a LayerNorm that holds for every ``h`` (the normed vector sums to zero, so
   ``h . (1 / w) = b . (1 / w)`` for norm weight ``w`` and bias ``b``): the GPT-2 models fold exactly, on
   every input (float32 rounding aside), and the logit lens of their intermediate blocks is unchanged too.
2. **Distil** (when the fold is not exact, as after an RMSNorm, which has no such constant direction):
   from the fold, minimise over ``W_U`` the mean KL divergence from the biased model's next-token
   distribution plus ``ce_weight`` times the cross-entropy of the answer (default 0: with 0.1 the KL
   divergence of ``arith-llama`` rose a hundredfold for no accuracy), with L-BFGS on the fixed features (a
   convex problem; one CPU thread, a few minutes).

:func:`refit_unembed` changes the model in place (``W_U`` refitted, ``b_U`` zero) and returns what the
card records: the method, the number of prompts, and on the fit prompts and on the validation split the
mean and largest KL divergence and the share of prompts whose argmax did not change.

:func:`fit_answers` refits ``W_U`` to the answers themselves instead of to the biased model (the readout phase
of a ground-truth recipe, :func:`circuits.zoo.groundtruth.readout_phase`), on the same fixed features.
"""

from __future__ import annotations

import numpy as np

from circuits.zoo.data import TaskData, build_splits
from circuits.zoo.recipes import TrainConfig

__all__ = ["FIT_PER_TASK", "FOLD_TOL", "MAX_ITER", "final_features", "fit_answers", "refit_unembed"]

FIT_PER_TASK = 2000
"""Training prompts per task the unembedding is fitted on (all of a smaller task)."""
MAX_ITER = 150
"""L-BFGS evaluations of the distillation at most."""
FOLD_TOL = 1e-4
"""Largest change of a centred logit (over the fit prompts) at which the fold counts as exact."""


def _sample(data: list[TaskData], per_task: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(tokens, answers)`` of at most ``per_task`` rows per task, drawn without replacement."""
    rng = np.random.default_rng(seed)
    out = []
    for d in data:
        idx = np.sort(rng.choice(len(d.tokens), size=min(per_task, len(d.tokens)), replace=False))
        out.append((d.tokens[idx], d.answers[idx]))
    return out


def final_features(model, batches: list[tuple[np.ndarray, np.ndarray]], chunk: int = 1024):
    """``(h [N, d_model], answers [N])``: the final-normed residual at the last position of every row of
    ``batches`` (one ``(tokens, answers)`` pair per task, rows of one length), a ``HookedTransformer``'s."""
    import torch

    hs, answers = [], []
    with torch.no_grad():
        for tokens, ans in batches:
            for i in range(0, len(tokens), chunk):
                resid = model(torch.from_numpy(tokens[i:i + chunk]), stop_at_layer=model.cfg.n_layers)[:, -1:]
                hs.append(model.ln_final(resid)[:, 0].float())
            answers.append(torch.from_numpy(ans))
    return torch.cat(hs), torch.cat(answers)


def _report(h, W, W0, b, answers) -> dict:
    """KL from the biased model, argmax agreement, accuracies and the largest centred logit change."""
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        old, new = h @ W0 + b, h @ W
        p, q = F.log_softmax(old, -1), F.log_softmax(new, -1)
        kl = (p.exp() * (p - q)).sum(-1).clamp_min(0.0)  # >= 0; float rounding gives -1e-10 after a fold
        change = new - old
        change = change - change.mean(-1, keepdim=True)
        return {"n": int(len(h)), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                "argmax_same": float((old.argmax(-1) == new.argmax(-1)).double().mean()),
                "accuracy_before": float((old.argmax(-1) == answers).double().mean()),
                "accuracy_after": float((new.argmax(-1) == answers).double().mean()),
                "max_logit_change": float(change.abs().max())}


def _minimise(W0, loss, max_iter: int, **tolerances):
    """``(W, evaluations)``: ``loss(W)`` (a scalar tensor) minimised over ``W`` from ``W0`` (not changed) with
    L-BFGS (strong-Wolfe line search, history 20, at most ``max_iter`` iterations; ``tolerances``: L-BFGS's)."""
    import torch

    W = W0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([W], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            **tolerances)
    evaluations = 0

    def closure():
        nonlocal evaluations
        evaluations += 1
        opt.zero_grad()
        value = loss(W)
        value.backward()
        return value

    opt.step(closure)
    return W.detach(), evaluations


def refit_unembed(model, cfg: TrainConfig, per_task: int = FIT_PER_TASK, seed: int = 0, ce_weight: float = 0.0,
                  max_iter: int = MAX_ITER) -> dict:
    """Remove the unembedding bias of ``model`` (a ``HookedTransformer``), refitting ``W_U`` on the
    training prompts of recipe ``cfg`` (a :class:`~circuits.zoo.recipes.TrainConfig`: its tasks, splits and
    seed) as the module docstring describes; in place. ``per_task`` training prompts per task are drawn
    with ``seed``; the report's ``"val"`` entry is measured on the validation split (``cfg.eval_n`` per
    task, never fitted). Returns ``{"method": "none" | "fold" | "distil", "fit": {...}, "val": {...},
    ...}`` (a model without a bias is left as it is: ``"none"``)."""
    import torch
    import torch.nn.functional as F

    W0 = model.unembed.W_U.detach().clone().float()
    b = model.unembed.b_U.detach().clone().float()
    if not bool(b.abs().max() > 0):
        return {"method": "none"}
    train, val = build_splits(cfg, model.tokenizer)
    was_training = model.training
    model.eval()
    h, answers = final_features(model, _sample(train, per_task, seed))
    hv, answers_v = final_features(model, [(d.tokens, d.answers) for d in val])
    h64 = h.double()
    beta = torch.linalg.lstsq(h64, torch.ones(len(h64), 1, dtype=torch.float64)).solution[:, 0]
    W = (W0.double() + beta[:, None] * b.double()[None]).float()
    fold = _report(h, W, W0, b, answers)
    method, iters = "fold", 0
    if fold["max_logit_change"] > FOLD_TOL:
        method = "distil"
        target = F.log_softmax(h @ W0 + b, -1)
        p = target.exp()

        def distil(W):
            logits = h @ W
            return ((p * (target - F.log_softmax(logits, -1))).sum(-1).mean()
                    + ce_weight * F.cross_entropy(logits, answers))

        W, iters = _minimise(W, distil, max_iter, tolerance_grad=1e-10, tolerance_change=1e-14)
    with torch.no_grad():
        model.unembed.W_U.copy_(W.to(model.unembed.W_U.dtype))
        model.unembed.b_U.zero_()
    model.train(was_training)
    return {"method": method, "per_task": per_task, "seed": seed, "ce_weight": ce_weight if method == "distil" else 0.0,
            "lbfgs_evaluations": iters, "fold": fold, "fit": _report(h, W, W0, b, answers),
            "val": _report(hv, W, W0, b, answers_v)}


def fit_answers(model, data: list[TaskData], per_task: int, answer_balance: float = 0.0,
                task_weights: dict | None = None, seed: int = 0, max_iter: int = 200) -> dict:
    """Refit the unembedding ``W_U`` of ``model`` (a ``HookedTransformer``; in place, ``b_U`` kept) to the
    answers: L-BFGS on the mean cross-entropy of the answer over the final-normed residuals of ``per_task``
    training prompts per task of ``data`` (times the task's weight in ``task_weights``, rounded; ``answer_balance``
    of them drawn with every answer value equally likely, :func:`circuits.zoo.data.answer_balanced`, the rest
    uniformly over the task's tuples), drawn with ``seed``. No other weight moves: what every position attends
    to, and every state before the unembedding, stays exactly as it was. A convex problem on fixed features
    (one CPU thread: ~1 minute for the features of 100 k prompts, a few for the fit). Returns ``{"n",
    "lbfgs_evaluations", "ce_before", "ce_after", "accuracy_before", "accuracy_after"}`` on the fit prompts."""
    import torch
    import torch.nn.functional as F

    from circuits.zoo.data import answer_balanced

    rng = np.random.default_rng(seed)
    batches = []
    for d in data:
        k = per_task * max(1, round((task_weights or {}).get(d.name, 1.0)))
        n_bal = int(answer_balance * k)
        idx = np.concatenate([rng.integers(0, len(d.tokens), size=k - n_bal), answer_balanced(d, rng, n_bal)])
        batches.append((d.tokens[idx], d.answers[idx]))
    was_training = model.training
    model.eval()
    h, answers = final_features(model, batches)
    b = model.unembed.b_U.detach().float()
    W0 = model.unembed.W_U.detach().clone().float()
    W, iters = _minimise(W0, lambda W: F.cross_entropy(h @ W + b, answers), max_iter)
    with torch.no_grad():
        before, after = h @ W0 + b, h @ W + b
        model.unembed.W_U.copy_(W.to(model.unembed.W_U.dtype))
    model.train(was_training)
    return {"n": int(len(h)), "lbfgs_evaluations": iters,
            "ce_before": float(F.cross_entropy(before, answers)), "ce_after": float(F.cross_entropy(after, answers)),
            "accuracy_before": float((before.argmax(-1) == answers).double().mean()),
            "accuracy_after": float((after.argmax(-1) == answers).double().mean())}
