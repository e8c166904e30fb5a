"""Faithfulness metrics against brute-force per-prompt computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interventions as iv
from circuits.faithfulness import bootstrap_ci, faithfulness, last_token_metrics
from tests.conftest import random_tokens


def test_last_token_metrics_by_hand():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    correct, prob, diff = last_token_metrics(logits, torch.tensor([1, 2]))
    assert correct.tolist() == [True, False]
    torch.testing.assert_close(prob, torch.tensor([np.exp(2) / (1 + np.e**2 + np.e), np.e / (np.e**3 + 1 + np.e)]).float())
    torch.testing.assert_close(diff, torch.tensor([1.0, -2.0]))


def test_faithfulness_counts_only_base_correct_prompts(model):
    tokens = random_tokens(40, 6, seed=40)
    plain_pred = model(tokens)[:, -1].argmax(-1)
    # Answers: the model's own prediction for the first 30 prompts, something else for the rest.
    answers = plain_pred.clone()
    answers[30:] = (plain_pred[30:] + 1) % model.cfg.d_vocab
    ivs = [iv.Peek([0, 1, 2, 3], "self")]
    res = faithfulness(model, tokens, answers, ivs, n_boot=200)
    assert res.n == 30
    inter = iv.run(model, tokens[:30], ivs)[:, -1].detach()
    expected = (inter.argmax(-1) == answers[:30]).float()
    assert res.n_faithful == int(expected.sum()) and res.faithfulness == pytest.approx(float(expected.mean()))
    assert 0 < res.faithfulness < 1, "the self peek should break some but not all prompts here"
    assert res.ci_low <= res.faithfulness <= res.ci_high
    assert res.mean_answer_prob == pytest.approx(float(inter.softmax(-1).gather(-1, answers[:30, None]).mean()), rel=1e-5)
    unchanged = faithfulness(model, tokens, answers, [iv.Peek([0], "full")], n_boot=200)
    assert unchanged.faithfulness == 1.0 and unchanged.mean_logit_diff > 0


def test_bootstrap_ci_is_reproducible_and_sane():
    values = np.array([1.0] * 90 + [0.0] * 10)
    lo, hi = bootstrap_ci(values, seed=3)
    assert (lo, hi) == bootstrap_ci(values, seed=3)
    assert 0.82 <= lo < 0.9 < hi <= 0.96


def test_faithfulness_errors(model):
    tokens = random_tokens(4, 6)
    with pytest.raises(ValueError, match="one token id per prompt"):
        faithfulness(model, tokens, torch.tensor([1, 2]), [])
    wrong = (model(tokens)[:, -1].argmax(-1) + 1) % model.cfg.d_vocab
    with pytest.raises(ValueError, match="none of these prompts"):
        faithfulness(model, tokens, wrong, [])


def test_prompt_faithfulness_equals_metrics_by_hand(model):
    """Per prompt, against logits of an independent computation (a ``-inf`` score mask instead of the
    package's peek): which prompts keep their answer, the answer's probability and its margin over the best
    other token, computed element by element; prompts the unmodified model gets wrong are dropped, and
    ``index`` says which of the given prompts each row is."""
    from circuits.faithfulness import prompt_faithfulness
    from tests.interventions.reference import peek_allowed, score_mask_hook

    tokens = random_tokens(40, 6, seed=41)
    answers = model(tokens)[:, -1].argmax(-1)
    wrong = [3, 17, 29]
    answers[wrong] = (answers[wrong] + 1) % model.cfg.d_vocab
    layers = [0, 1, 2, 3]
    peek = [iv.Peek(layers, "self", "last")]
    mask = score_mask_hook(peek_allowed(6, "self", "last"))
    ref = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_attn_scores", mask) for l in layers])[:, -1]
    texts = [f"prompt {i}" for i in range(40)]
    out = prompt_faithfulness(model, tokens, answers, peek, prompts=texts)
    kept = [i for i in range(40) if i not in wrong]
    assert out.index.tolist() == kept and out.prompts == [texts[i] for i in kept] and out.n == 37
    for row, i in enumerate(kept):
        logits = ref[i].double().tolist()
        a = int(answers[i])
        best_other = max(v for j, v in enumerate(logits) if j != a)
        assert bool(out.faithful[row]) == (max(range(len(logits)), key=logits.__getitem__) == a)
        assert out.answer_prob[row] == pytest.approx(np.exp(logits[a]) / np.exp(logits).sum(), abs=1e-5)
        assert out.logit_diff[row] == pytest.approx(logits[a] - best_other, abs=1e-4)
    assert 0 < len(out.flipped()) < out.n, "the peek should flip some prompts but not all"
    assert [kept[r] for r in out.flipped()] == [i for r, i in enumerate(kept) if not out.faithful[r]]
    agg = faithfulness(model, tokens, answers, peek, n_boot=50)
    assert agg.n_faithful == int(out.faithful.sum()) and agg.mean_answer_prob == pytest.approx(out.answer_prob.mean())
    rows = out.rows()
    assert rows[0] == {"index": 0, "prompt": "prompt 0", "faithful": bool(out.faithful[0]),
                       "answer_prob": float(out.answer_prob[0]), "logit_diff": float(out.logit_diff[0])}
    same = prompt_faithfulness(model, tokens[kept], answers[kept], peek, assume_correct=True)
    assert same == out and same.index.tolist() == list(range(37))
