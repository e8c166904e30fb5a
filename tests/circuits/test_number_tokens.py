"""Numbers a model cannot read: a task whose slot ranges over numbers the tokenizer reads as ``<unk>`` is refused
before any prompt is scored, naming the slot, the numbers and a range that works; where prompts are dropped as
intended (answers beyond the vocabulary), the run says how many and why (docs/reliability.md, "Models, run
directories and signals")."""

from __future__ import annotations

import logging

import pytest

from circuits import zoo
from circuits.errors import ArgumentError
from circuits.prompts.spec import PromptSpec
from circuits.tasks import catalogue
from circuits.tasks.checks import MAX_CHECKED_VALUES, spans, unknown_numbers


@pytest.fixture(scope="module")
def arith():
    return zoo.load("arith-gpt2")


def task_file(tmp_path, name: str, hi: int, answer_max: int | None = None) -> str:
    path = tmp_path / f"{name}.toml"
    bound = f"answer_max = {answer_max}\n" if answer_max is not None else ""
    path.write_text(f'name = "{name}"\ntemplate = "{{A}}+{{B}}="\nanswer = "A+B"\n{bound}[slots]\n'
                    f'A = {{ range = [0, {hi}] }}\nB = {{ range = [0, 9] }}\n')
    return str(path)


def test_the_unknown_numbers_of_the_zoo_tokenizer_are_those_beyond_its_vocabulary(arith):
    tok = arith.tokenizer
    assert tok.convert_ids_to_tokens(tok("1999+3=", add_special_tokens=False)["input_ids"])[0] == tok.unk_token
    assert unknown_numbers(tok, 0, 2000) == list(range(521, 2001))
    assert unknown_numbers(tok, 0, 520) == []
    big = unknown_numbers(tok, 0, 10**9)  # sampled: bounded time and memory
    assert len(big) < MAX_CHECKED_VALUES and big[0] >= 521 and big[-1] == 10**9
    assert spans([1, 2, 3, 7, 9, 10]) == "1..3, 7, 9..10" and spans([1, 3, 5, 7], limit=2) == "1, 3, ..."


def test_a_slot_beyond_the_vocabulary_is_refused_before_any_prompt_is_scored(arith, tmp_path, monkeypatch):
    """``1999+3=`` was tokenised ``<bos> <unk> + 3 =`` and scored: base accuracy 18.9%, exit 0, no word."""
    def never(*_a, **_k):
        raise AssertionError("a prompt was scored")

    monkeypatch.setattr(catalogue, "filter_correct", never)
    path = task_file(tmp_path, "big", 2000)
    with pytest.raises(ArgumentError) as caught:
        PromptSpec(task=path, n_prompts=20).prepare(arith)
    said = str(caught.value)
    assert said == (f"task file {path}: slots.A ranges over 0..2000, but 1480 of those numbers (521..2000) are "
                    f"unknown to this model's tokenizer (read as '<unk>'), so prompts holding them cannot be read; "
                    f"narrow slots.A to range = [0, 520]")


def test_dropped_prompts_are_counted_and_explained(arith, tmp_path, caplog):
    """``{A}+{B}=`` with A up to 520 and no answer_max: the answers above 520 are not in the vocabulary, and their
    prompts are dropped as intended, now saying so."""
    spec = PromptSpec(task=task_file(tmp_path, "wide", 520), n_prompts=20)
    p = spec.prepare(arith, progress=False)  # the same prompts ready() draws, with their counts
    assert 0 < p.n_dropped_multi_token < p.n_drawn
    with caplog.at_level(logging.INFO, logger="circuits"):
        spec.ready(arith, name="arith-gpt2", means=None, progress=False)
    text = "\n".join(r.getMessage() for r in caplog.records)
    line = next(x for x in text.splitlines() if x.startswith("dropped "))
    assert line.startswith(f"dropped {p.n_dropped_multi_token:,} of the {p.n_drawn:,} drawn prompts before scoring: "
                           f"an operand or the answer is not a single token")
    bounded = PromptSpec(task=task_file(tmp_path, "bounded", 520, answer_max=520), n_prompts=20)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="circuits"):
        bounded.ready(arith, name="arith-gpt2", means=None, progress=False)
    assert not any(r.getMessage().startswith("dropped ") for r in caplog.records)
