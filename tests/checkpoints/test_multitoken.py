"""Numbers of several tokens (``--numbers multi``, :mod:`circuits.tasks.digits`) on the digit tokenizer of the
Qwen2 stand-in: layouts that line up digit by digit, answers read under teacher forcing, and the search's
fast path equal to complete intervened passes; with single-token numbers exactly the single-token path."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from circuits.faithfulness import last_token_metrics
from circuits.prompts.sampling import prepare_prompts
from circuits.search import FastEvaluator, NaiveEvaluator, configurations, search_af1
from circuits.tasks import catalogue as tasks
from circuits.tasks.digits import filter_multi_token, number_roles
from interventions.readout import answer_readout, readout_metrics
from tests import standins
from tests.checkpoints.conftest import combos


def test_roles_follow_the_digits():
    assert number_roles("12+3=", [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]) == (0, 0, -1, 1, -1)
    assert number_roles("is 42", [(0, 2), (2, 3), (3, 4), (4, 5)]) == (-1, -1, 0, 0)
    assert number_roles("is 42", [(0, 2), (2, 4), (4, 5)]) == (-1, 0, 0)  # a leading space joins the number
    assert number_roles("1+23=", [(0, 3), (3, 5)]) is None  # a token joins digits and the operator


def test_digit_layouts_and_teacher_forced_answers(load_standin):
    model = load_standin("qwen2", "bridge")
    tok = model.tokenizer
    ds = tasks.build_task("add", n=300, seed=0)
    kept, dropped = filter_multi_token(ds, model)
    assert dropped == 0 and len(kept) == 300
    row = next(r for r in kept if r["prompt"] == "35+77=" or len(r["answer_ids"]) == 3)
    assert tok.convert_ids_to_tokens(row["answer_ids"]) == list(str(row["answer"]))
    layouts = tasks.to_layouts(model, kept, prepend_bos=True)
    assert sum(len(lay) for lay in layouts) == 300
    for lay in layouts:
        k = 1 if lay.answers.ndim == 1 else lay.answers.shape[1]
        for r, i in enumerate(lay.indices[:5]):
            text = kept[i]["prompt"]
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert lay.tokens[r, 1 : 1 + len(ids)].tolist() == ids  # BOS, the prompt, then k-1 answer tokens
            answer = lay.answers[r].tolist() if k > 1 else [int(lay.answers[r])]
            assert lay.tokens[r, 1 + len(ids):].tolist() == answer[:-1]
            assert tok.decode(answer) == str(kept[i]["answer"])
        digits = {len(str(kept[i]["answer"])) for i in lay.indices}
        operand_digits = {tuple(len(str(v)) for v in kept[i]["operands"]) for i in lay.indices}
        assert digits == {k} and len(operand_digits) == 1  # one layout: the same digit counts everywhere


def test_single_token_numbers_reduce_exactly(zoo_model):
    """On a tokenizer that writes every number as one token, ``numbers="multi"`` gives the single-token
    prompts, answers and results."""
    single = prepare_prompts(zoo_model, "add_sub", 40, seed=3, progress=False)
    multi = prepare_prompts(zoo_model, "add_sub", 40, seed=3, progress=False, numbers="multi")
    assert torch.equal(single.tokens, multi.tokens) and torch.equal(single.answers, multi.answers)
    assert multi.answers.ndim == 1 and single.base_accuracy == multi.base_accuracy


@pytest.fixture(scope="module")
def zoo_model():
    from circuits import zoo

    return zoo.load("arith-gpt2")


def test_readout_of_several_tokens_equals_metrics_by_hand():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, 11, generator=g)
    answers = torch.randint(0, 11, (5, 3), generator=g)
    answers[0] = logits[0].argmax(-1)  # one prompt right at every token
    correct, prob, margin = readout_metrics(answer_readout(logits, answers), answers)
    probs = logits.softmax(-1)
    for b in range(5):
        hits = [int(logits[b, j].argmax()) == int(answers[b, j]) for j in range(3)]
        assert bool(correct[b]) == all(hits)
        assert float(prob[b]) == pytest.approx(float(torch.prod(torch.stack(
            [probs[b, j, answers[b, j]] for j in range(3)]))), rel=1e-5)
        others = [float(logits[b, j, answers[b, j]] - logits[b, j].scatter(0, answers[b, j : j + 1],
                                                                           float("-inf")).max()) for j in range(3)]
        assert float(margin[b]) == pytest.approx(min(others), rel=1e-5, abs=1e-6)
    assert bool(correct[0])
    same = last_token_metrics(logits, answers)
    assert torch.equal(same[0], correct) and torch.allclose(same[1], prob) and torch.allclose(same[2], margin)


@pytest.mark.parametrize("key,backend", combos(["qwen2"]))
def test_fast_equals_naive_with_answers_of_several_tokens(key, backend, load_standin):
    model = load_standin(key, backend)
    p = standins.self_answered_multi(model, "add", 16)
    assert p.answers.ndim == 2 and p.answers.shape[1] >= 2
    cache = iv.MeanCache.fit(model, p.fit.tokens, progress=False)
    for ablation in ("cama", "zero"):
        fast = FastEvaluator(model, p.tokens, p.answers, cache, ablation, 8)
        naive = NaiveEvaluator(model, p.tokens, p.answers, cache, ablation, 8)
        seen = set()
        for w, t in configurations(model.cfg.n_layers):
            cf, pf, df = fast.evaluate(w, t)
            cn, pn, dn = naive.evaluate(w, t)
            assert torch.equal(cf, cn), (ablation, w, t)
            torch.testing.assert_close(df, dn, atol=1e-4, rtol=0)
            seen.add(int(cf.sum()))
        assert len(seen) > 1  # the configurations differ: a mismatch would show
    result = search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", progress=False, n_boot=10)
    assert result.base_accuracy == 1.0 and len(result.results) == len(configurations(model.cfg.n_layers))
    peeks = [x for x in result.interventions if x["type"] == "Peek" and x["queries"] != "all"]
    assert all(x["n_last"] == p.answers.shape[1] for x in peeks) or not result.selected


def test_every_answer_position_is_a_last_token():
    """Peek(n_last=k): the last k rows are the last group (full in transfer blocks, self after them)."""
    rows = iv.allowed_keys(6, "self", "others", n_last=2)
    assert rows[4].tolist() == [True] * 5 + [False] and rows[5].all()  # the answer rows read everything
    assert rows[3].tolist() == [True, False, False, True, False, False]  # the others only BOS and themselves
    sub = iv.af1_subgraph(4, 0, 1, None, "zero", n_last=3)
    assert [x.n_last for x in sub if isinstance(x, iv.Peek) and x.queries != "all"] == [3, 3]
    assert iv.af1_subgraph(4, 0, 1, None, "zero") == iv.af1_subgraph(4, 0, 1, None, "zero", n_last=1)
