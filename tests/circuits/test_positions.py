"""Prompts longer than the model's positions (the zoo models have 32): one line with exit code 2 before any
forward pass, not an ``IndexError`` from the position table; a text too long to fit whatever it tokenises to (a
5 MB prefix) is refused from its length alone, at once (docs/reliability.md, "Models, run directories and
signals")."""

from __future__ import annotations

import time

import pytest

from circuits import cli, zoo
from circuits.errors import PromptError
from circuits.tasks.positions import check_positions, check_text_fits, fewest_tokens, longest_token, positions_of
from tests.circuits.test_reliability2 import one_line_error

TEMPLATE = 'template = "{A}+{B}="\nanswer = "A+B"\nanswer_max = 520\n'
SLOTS = "[slots]\nA = { range = [0, 99] }\nB = { range = [0, 99] }\n"


@pytest.fixture(scope="module")
def arith():
    return zoo.load("arith-gpt2")


def test_the_bounds(arith):
    tok = arith.tokenizer
    assert positions_of(arith) == arith.cfg.n_ctx == 32
    longest = longest_token(tok)
    assert longest == max(len(t) for t in tok.get_vocab())
    text = "1+1=2 " * 50
    assert fewest_tokens(text, tok) <= len(tok(text, add_special_tokens=False)["input_ids"])
    check_positions(arith, 32)
    with pytest.raises(PromptError, match="prompts of 33 tokens exceed the 32 positions of this model"):
        check_positions(arith, 33)
    check_text_fits("x" * (32 * longest), arith, tok, "t")
    with pytest.raises(PromptError, match=r"t has \d+ characters, at least 33 tokens: more than the 32 positions"):
        check_text_fits("x" * (32 * longest + 1), arith, tok, "t")


def many_slots(n: int) -> str:
    names = [chr(ord("A") + i) for i in range(n)]
    slots = "".join(f"{x} = {{ range = [0, 9] }}\n" for x in names)
    return (f'template = "{"+".join("{" + x + "}" for x in names)}="\nanswer = "{"+".join(names)}"\n'
            f"answer_max = 520\n[slots]\n{slots}")


CASES = {
    "6 shots": ("add", ["--shots", "6"], "prompts of"),
    "a 40-token prefix": ('name = "long"\nprefix = "' + "1+1=2 " * 8 + '"\n' + TEMPLATE + SLOTS, [], "prompts of"),
    "20 slots": ('name = "slots"\n' + many_slots(20), [], "prompts of"),
}


@pytest.mark.parametrize("case", CASES)
def test_prompts_longer_than_the_positions_are_one_line(case, arith, tmp_path, capsys):
    body, flags, said = CASES[case]
    task = body
    if "\n" in body:
        path = tmp_path / "task.toml"
        path.write_text(body)
        task = str(path)
    out = tmp_path / "run"
    code = cli.main(["search", "--model", "arith-gpt2", "--task", task, "--n-prompts", "5", "--out", str(out),
                     "--no-progress", *flags])
    line = one_line_error(capsys, code, said, "positions of this model", "shorten the task's prefix, lower --shots")
    assert "exceed the 32 positions" in line


def test_a_5_mb_prefix_is_refused_at_once_without_tokenising_it(arith, tmp_path, capsys, monkeypatch):
    """It ran 300 s to 2.6 GB without a message. A task file that large is now refused by its size before it is
    parsed; a prefix that fits a task file but not the model is refused from its length, without tokenising it."""
    path = tmp_path / "huge.toml"
    path.write_text('name = "huge"\nprefix = "' + "1+1=2 " * 900_000 + '"\n' + TEMPLATE + SLOTS)
    assert path.stat().st_size > 5_000_000
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code = cli.main(["search", "--model", "arith-gpt2", "--task", str(path), "--n-prompts", "5", "--out", str(out),
                     "--no-progress"])
    seconds = time.perf_counter() - t0
    one_line_error(capsys, code, f"task file {path} is larger than 1,048,576 bytes")
    assert seconds < 30, seconds
    path.write_text('name = "huge"\nprefix = "' + "1+1=2 " * 150_000 + '"\n' + TEMPLATE + SLOTS)
    t0 = time.perf_counter()
    code = cli.main(["search", "--model", "arith-gpt2", "--task", str(path), "--n-prompts", "5", "--out", str(out),
                     "--no-progress"])
    seconds = time.perf_counter() - t0
    one_line_error(capsys, code, "the text before every prompt of task", "has 900,000 characters, at least",
                   "more than the 32 positions of this model")
    assert seconds < 30, seconds
