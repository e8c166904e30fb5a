"""Tokenizer-aware tasks and prompt sampling, with the real-format tokenizers of the stand-ins.

``Oracle`` is a model that reads each prompt's text and answers it correctly exactly where a rule on
the operands holds, so the expected counts of ``prepare_prompts`` can be recomputed independently
(brute-force tokenisation of the drawn prompts, the rule on their operands).
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from circuits.errors import ArgumentError, PromptError
from circuits.prompts import sampling
from circuits.tasks import catalogue as tasks
from tests import standins


@pytest.fixture(scope="module")
def toks():
    return {style: standins.build_tokenizer(style) for style in ("gpt2", "llama3", "qwen2")}


class Oracle(torch.nn.Module):
    """Answers ``A+B`` prompts correctly where ``rule(A, B)`` holds, else with a wrong token. The correct
    next token is whatever the tokenizer writes after the text (a space first if the text ends in a
    letter, as in running text)."""

    def __init__(self, tok, rule, prepend_bos: bool = True):
        super().__init__()
        self.tokenizer, self.rule = tok, rule
        self.cfg = SimpleNamespace(default_prepend_bos=prepend_bos, d_vocab=len(tok))
        self.dummy = torch.nn.Parameter(torch.zeros(()))
        self.rows = 0
        self.wrong = tok.encode("=", add_special_tokens=False)[0]

    def forward(self, tokens, return_type="logits"):
        out = torch.zeros(*tokens.shape, len(self.tokenizer))
        for i, row in enumerate(tokens.tolist()):
            self.rows += 1
            text = self.tokenizer.decode(row, skip_special_tokens=True)
            a, b = map(int, re.findall(r"\d+", text))
            follow = (" " if text[-1].isalpha() else "") + str(a + b)
            base = self.tokenizer.encode(text, add_special_tokens=False)
            nxt = self.tokenizer.encode(text + follow, add_special_tokens=False)[len(base):]
            out[i, -1, nxt[0] if self.rule(a, b) and len(nxt) == 1 else self.wrong] = 1.0
        return out


def _single(tok, v: int) -> bool:
    return len(tok.tokenize(str(v))) == 1


def _expected(tok, rule, task: str, n_drawn: int, seed: int = 0):
    """Independent recount over the first ``n_drawn`` prompts of the seed's order (``A+B=`` prompts:
    numbers follow an operator or start the text, so each is tokenised on its own)."""
    ds = tasks.build_task(task, n=n_drawn, seed=seed)
    single = [(r["prompt"], r["operands"]) for r in ds if all(_single(tok, v) for v in r["operands"] + [r["answer"]])]
    correct = [p for p, ops in single if rule(*ops)]
    return single, correct


# ------------------------------------------------------------------------------------ tokenizer-aware
def test_single_token_ranges_match_brute_force(toks):
    gpt2, llama3, qwen2 = toks["gpt2"], toks["llama3"], toks["qwen2"]
    assert tasks.single_token_ranges(llama3, 0, 999) == [(0, 999)]
    assert tasks.single_token_ranges(llama3, 0, 999, after_space=True) == [(0, 999)]
    assert tasks.single_token_ranges(qwen2, 0, 999) == tasks.single_token_ranges(qwen2, 0, 999, True) == [(0, 9)]
    for after_space in (False, True):
        ranges = tasks.single_token_ranges(gpt2, 0, 520, after_space)
        got = {v for lo, hi in ranges for v in range(lo, hi + 1)}
        # a space that stays its own token ('Ġ' then '0') is not part of the number
        pieces = {v: gpt2.tokenize((" " if after_space else "") + str(v)) for v in range(521)}
        want = {v for v, t in pieces.items() if len([x for x in t if x != "Ġ"]) == 1}
        assert got == want
        assert len(ranges) > 5 and any(v >= 100 for v in got) and len(got) < 300  # irregular merges
    assert tasks.number_tokens(gpt2, 7, after_space=True) == ["Ġ7"]
    assert tasks.number_tokens(llama3, 437, after_space=True) == ["437"]
    assert tasks.number_tokens(qwen2, 43) == ["4", "3"]


@pytest.mark.parametrize("style,moves", [("gpt2", True), ("llama3", False)])
def test_answer_follows_the_prompt_as_in_running_text(toks, style, moves):
    tok = toks[style]
    prompt, text, ids = tasks.answer_form(tok, "The sum of 12 and 34 is ", 46)
    assert (prompt, text) == (("The sum of 12 and 34 is", " 46") if moves else ("The sum of 12 and 34 is ", "46"))
    assert tok.convert_ids_to_tokens(ids) == (["Ġ46"] if moves else ["46"])
    ds = tasks.build_task("verbal_add", n=200, seed=1)
    kept, dropped = tasks.filter_single_token(ds, tok, verbose=False)
    assert 0 < len(kept) and len(kept) + dropped == 200
    for r in kept:
        # the invariant: the answer token is exactly what the tokenizer adds after the prompt
        ids = tok.encode(r["prompt"], add_special_tokens=False)
        assert tok.encode(r["prompt"] + r["answer_text"], add_special_tokens=False)[:-1] == ids
        assert r["prompt"].endswith(" ") != moves and r["answer_text"].strip() == str(r["answer"])
    lay = tasks.to_layouts(SimpleNamespace(tokenizer=tok, cfg=SimpleNamespace(default_prepend_bos=False)), kept)
    for layout in lay:
        for r, text in enumerate(layout.answer_texts):
            assert tok.decode([int(layout.answers[r])]) == text


# ------------------------------------------------------------------------------------ sampling
def test_sampling_continues_until_enough_correct_prompts(toks):
    tok = toks["gpt2"]
    rule = lambda a, b: (a + b) % 7 == 0  # noqa: E731 - about one prompt in seven
    model = Oracle(tok, rule)
    p = sampling.prepare_prompts(model, "add", 40, seed=0, progress=False)
    assert len(p) == 40 and p.stop == "found" and p.n_drawn > 3 * 40  # more than the first round
    single, correct = _expected(tok, rule, "add", p.n_drawn)
    assert p.n_checked == len(single) == model.rows  # each checked prompt: one forward row
    assert p.n_dropped_multi_token == p.n_drawn - len(single)
    assert p.n_correct == len(correct) and p.n_wrong == len(single) - len(correct)
    assert p.base_accuracy == pytest.approx(len(correct) / len(single))
    assert p.prompts == correct[:40] and len(set(p.prompts)) == 40  # in draw order, no repeats
    assert [tok.decode([t]) for t in p.answers.tolist()] == [str(v) for v in p.answer_values]
    assert (p.tokens[:, 0] == tok.bos_token_id).all() and p.prepend_bos
    rec = p.records()[0]
    assert rec == {"prompt": p.prompts[0], "answer": p.answer_values[0], "answer_token": int(p.answers[0]),
                   "answer_text": str(p.answer_values[0])}
    assert p.summary()["n_drawn"] == p.n_drawn


def test_zero_accuracy_is_called_only_after_enough_prompts(toks):
    """A model that answers nothing is stopped once ``ZERO_CHECKED`` prompts say its accuracy is below 3%, not after
    the first round (3 x 10 prompts); the message states the bound."""
    tok = toks["gpt2"]
    model = Oracle(tok, lambda a, b: False)
    single, _ = _expected(tok, lambda a, b: False, "add", 3 * 10 + 4 * 3 * 10)  # the first round, then 4 times it
    assert len(single) >= sampling.ZERO_CHECKED > len(_expected(tok, lambda a, b: False, "add", 30)[0])
    bound = 1 - 0.05 ** (1 / len(single))
    assert 2.5 / len(single) < bound < 3 / len(single)
    with pytest.raises(PromptError, match=rf"^task 'add': the model answers none of the {len(single)} checked "
                                          rf"prompts correctly \(base accuracy below {bound:.1%} at 95% "
                                          rf"confidence\); choose"):
        sampling.prepare_prompts(model, "add", 10, progress=False)
    assert model.rows == len(single)
    # too few prompts to say more: the message says so
    with pytest.raises(PromptError, match=r"none of the 20 checked .*below 13\.9% at 95% confidence; only 20 could "
                                          r"be checked \(--max-checked\)"):
        sampling.prepare_prompts(Oracle(tok, lambda a, b: False), "add", 10, max_checked=20, progress=False)


def test_two_prompts_of_a_model_of_low_accuracy_are_found(toks):
    """``--n-prompts 2`` on a model that answers about one prompt in eight: the first round (6 prompts, none answered
    here) is not taken for zero accuracy; the search goes on until two are found."""
    tok = toks["gpt2"]
    first = {tuple(r["operands"]) for r in tasks.build_task("add", n=6, seed=0)}
    rule = lambda a, b: (a, b) not in first and (a + b) % 8 == 0  # noqa: E731
    p = sampling.prepare_prompts(Oracle(tok, rule), "add", 2, progress=False)
    assert len(p) == 2 and p.n_correct >= 2 and p.n_checked > 6
    single, correct = _expected(tok, rule, "add", p.n_drawn)
    assert p.n_checked == len(single) and p.n_correct == len(correct)


def test_budget_and_exhaustion_name_the_count_that_works(toks):
    tok = toks["gpt2"]
    rule = lambda a, b: (a + b) % 7 == 0  # noqa: E731
    model = Oracle(tok, rule)
    with pytest.raises(PromptError, match=r"too few correct prompts .*lower --n-prompts to (\d+) or less, "
                                          r"raise --max-checked above 100") as err:
        sampling.prepare_prompts(model, "add", 40, max_checked=100, progress=False)
    assert model.rows == 100
    # independent: the correct ones among the first 100 single-token prompts
    single, _ = _expected(tok, rule, "add", 400)
    n_ok = sum(rule(*ops) for _, ops in single[:100])
    assert re.search(r"to (\d+) or less", str(err.value)).group(1) == str(n_ok)
    # the operand space runs out: every prompt was drawn once; the error names how many there are
    same = lambda a, b: a == b  # noqa: E731
    with pytest.raises(PromptError, match=r"too few correct prompts") as err:
        sampling.prepare_prompts(Oracle(tok, same), "add", 200, progress=False)
    single, correct = _expected(tok, same, "add", 10_000)
    assert f"{len(correct)} of {len(single)} checked prompts" in str(err.value)
    assert f"lower --n-prompts to {len(correct)} or less, or use" in str(err.value)
    p = sampling.prepare_prompts(Oracle(tok, same), "add", 200, min_prompts=10, progress=False)
    assert p.stop == "exhausted" and p.n_drawn == 10_000 and len(p) == len(correct)


def test_arguments_are_checked_first(toks):
    model = Oracle(toks["gpt2"], lambda a, b: True)
    # add_small: A, B in 0..99 with A + B <= 99, i.e. 100 + 99 + ... + 1 prompts
    with pytest.raises(ArgumentError, match=r"^n_prompts=6000 is more than task 'add_small' can give \(its operand "
                                            r"space has 5050 prompts\): lower --n-prompts to 5050 or less$"):
        sampling.prepare_prompts(model, "add_small", 6000, progress=False)
    with pytest.raises(ArgumentError, match="max_checked=0 must be an integer >= 1"):
        sampling.prepare_prompts(model, "add", 5, max_checked=0, progress=False)
    with pytest.raises(ArgumentError, match="min_prompts=9 must be between 1 and n_prompts=5"):
        sampling.prepare_prompts(model, "add", 5, min_prompts=9, progress=False)
    with pytest.raises(ArgumentError, match="prepend_bos='yes' must be True, False or None"):
        sampling.prepare_prompts(model, "add", 5, prepend_bos="yes", progress=False)
    assert model.rows == 0


@pytest.mark.parametrize("style,text", [("gpt2", " "), ("llama3", "")])
def test_records_say_how_the_answer_is_written(toks, style, text):
    tok = toks[style]
    p = sampling.prepare_prompts(Oracle(tok, lambda a, b: True), "verbal_add", 12, progress=False)
    for rec in p.records():
        assert rec["answer_text"] == text + str(rec["answer"])
        assert rec["prompt"].endswith(" ") == (text == "")
        ids = tok.encode(rec["prompt"], add_special_tokens=False)
        assert tok.encode(rec["prompt"] + rec["answer_text"], add_special_tokens=False) == ids + [rec["answer_token"]]


def test_bos_default_and_progress_bar(toks, capsys):
    tok = toks["gpt2"]
    bos = tok.bos_token_id
    p = sampling.prepare_prompts(Oracle(tok, lambda a, b: True, prepend_bos=False), "add", 8, progress=False)
    assert not p.prepend_bos and p.bos_token is None and p.tokens[0].tolist() == tok.encode(p.prompts[0])
    with pytest.raises(PromptError, match="use --prepend-bos"):
        sampling.check_bos(Oracle(tok, None, prepend_bos=False), p.tokens)
    q = sampling.prepare_prompts(Oracle(tok, lambda a, b: True, prepend_bos=False), "add", 8, prepend_bos=True)
    assert q.prepend_bos and q.bos_token == bos and q.tokens[:, 1:].tolist() == p.tokens.tolist()
    assert "prompts of add" in capsys.readouterr().err
