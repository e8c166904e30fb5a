"""Prompt datasets (``--prompts`` / ``PromptSpec(prompts=...)``): reading and one-line errors, layouts, answers and
the fit set drawn from the other rows; and answers that are text end to end (search, necessity, lens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from circuits import cli, zoo
from circuits.errors import ArgumentError
from circuits.prompts.datasets import read_prompts
from circuits.prompts.spec import PromptSpec
from circuits.tasks import catalogue as tasks
from interventions.coverage import entry_counts, row_digests


@pytest.fixture(scope="module")
def gpt2():
    return zoo.load("arith-gpt2")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _add_rows(n: int = 400, hi: int = 99) -> list[dict]:
    ds = tasks.build_task("add", n=n, seed=5, operand_ranges=[(0, hi), (0, hi)])
    return [{"prompt": r["prompt"], "answer": r["answer"], "A": r["operands"][0], "B": r["operands"][1]} for r in ds]


# ------------------------------------------------------------------------------ reading, one-line errors
@pytest.mark.parametrize("name,text,expected", [
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n{"prompt": "1+3=", "answer": 4\n', "line 2: not JSON"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n\n{"prompt": "1+3="}\n', "line 3: column answer: missing"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": [3]}\n', "line 1: column answer: [3] is not"),
    ("p.jsonl", '{"prompt": "", "answer": 3}\n', "line 1: column prompt"),
    ("p.jsonl", '[1, 2]\n', "line 1: must be a JSON object"),
    ("p.jsonl", "\n", "has no rows"),
    ("p.csv", "prompt,solution\n1+2=,3\n", "column answer: missing"),
    ("p.csv", 'prompt,answer\n1+2=,3\n"",4\n', "line 3: column prompt"),
    ("p.txt", "1+2=3\n", "give a .jsonl or .csv file"),
])
def test_prompt_file_errors_are_one_line_naming_file_line_and_column(tmp_path, capsys, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ArgumentError) as err:
        read_prompts(path)
    assert str(err.value).startswith(f"prompts file {path}") and expected in str(err.value), str(err.value)
    code = cli.main(["search", "--model", "arith-gpt2", "--prompts", str(path), "--out", str(tmp_path / "o")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and expected in lines[0], lines


def test_task_and_prompts_are_one_or_the_other(tmp_path, capsys):
    path = _jsonl(tmp_path / "p.jsonl", _add_rows(10))
    for extra in ([], ["--task", "add", "--prompts", str(path)]):
        code = cli.main(["search", "--model", "arith-gpt2", *extra, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "exactly one" in err[0], err
    code = cli.main(["search", "--model", "arith-gpt2", "--prompts", str(path), "--n-prompts", "11",
                     "--out", str(tmp_path / "o")])
    assert code == 2 and "exceeds the 10 rows" in capsys.readouterr().err


# ------------------------------------------------------------------------------ prompts and fit set
def test_a_prompt_file_gives_prompts_and_a_disjoint_fit_set(gpt2, tmp_path):
    rows = _add_rows(400, hi=19)  # each operand value in 20 rows: CAMA's means have rows to average over
    path = _jsonl(tmp_path / "add.jsonl", rows)
    p = PromptSpec(prompts=str(path), n_prompts=40, seed=1).prepare(gpt2, means="cama", progress=False)
    assert len(p) == 40 and p.source == "prompts" and p.task == str(path)
    truth = {r["prompt"]: r["answer"] for r in rows}
    assert all(truth[q] == int(a) for q, a in zip(p.prompts, p.answer_values))
    # the tokens are what the model's tokenizer makes of the prompts, BOS first, and the answers their tokens
    lay = tasks.to_layouts(gpt2, tasks.filter_single_token(
        tasks.build_task("add", n=1), gpt2, verbose=False)[0])[0]
    assert p.tokens.shape[1] == lay.n_pos and bool((p.tokens[:, 0] == gpt2.tokenizer.bos_token_id).all())
    assert [gpt2.tokenizer.decode([int(t)]) for t in p.answers] == [str(a) for a in p.answer_values]
    # fit set: the file's other rows of the layout, none of them scored, each CAMA entry backed >= min_count times
    fit = p.fit
    assert not bool(torch.isin(row_digests(fit.tokens), row_digests(p.tokens)).any())
    same_len = sum(1 for r in rows if len(gpt2.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) + 1
                   == p.tokens.shape[1])
    assert len(fit) == same_len - 40
    assert int(entry_counts(fit.tokens, p.tokens)[:, 1:].min()) >= fit.spec.min_count
    # the same rows as CSV (answers are text there) and as a Dataset give the same prompts
    csv = tmp_path / "add.csv"
    csv.write_text("prompt,answer,A,B\n" + "".join(f"{r['prompt']},{r['answer']},{r['A']},{r['B']}\n" for r in rows))
    q = PromptSpec(prompts=str(csv), n_prompts=40, seed=1).prepare(gpt2, means="cama", progress=False)
    assert q.prompts == p.prompts and torch.equal(q.answers, p.answers)
    from datasets import Dataset

    d = PromptSpec(prompts=Dataset.from_list(rows), n_prompts=40, seed=1).prepare(gpt2, means="cama", progress=False)
    assert d.prompts == p.prompts and d.task.startswith("dataset:")


def test_values_seen_once_cannot_be_conditioned_on(gpt2, tmp_path):
    rows = [r for r in _add_rows(2000) if r["B"] == 7][:60]  # every A once: no other row backs its token
    path = _jsonl(tmp_path / "once.jsonl", rows)
    with pytest.raises(ValueError, match="fewer than 5 other rows hold"):
        PromptSpec(prompts=str(path), n_prompts=10).prepare(gpt2, means="cama", progress=False)
    p = PromptSpec(prompts=str(path), n_prompts=10).prepare(gpt2, means=None, progress=False)
    assert len(p) == 10 and p.fit is None


# ------------------------------------------------------------------------------ text answers, end to end
def test_a_lookup_task_file_runs_search_necessity_and_lens(tmp_path):
    """String slots and string answers (a lookup column) through the commands: the zoo model copies the first
    operand of ``x+y-y=``, whose answers the file gives as text."""
    xs = [str(v) for v in range(10, 40)]
    path = tmp_path / "copy.toml"
    table = ", ".join(f'"{v}" = "{v}"' for v in xs)
    path.write_text(f'name = "copy"\ntemplate = "{{x}}+{{y}}-{{y}}="\n[slots]\nx = {{ values = {json.dumps(xs)} }}\n'
                    'y = { values = ["1", "2", "3", "4", "5", "6", "7", "8"] }\n[answer]\nlookup = "x"\n'
                    f'table = {{ {table} }}\n')
    common = ["--model", "arith-gpt2", "--task", str(path), "--n-prompts", "12", "--no-progress"]
    assert cli.main(["search", *common, "--out", str(tmp_path / "s")]) == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["task"] == str(path) and summary["n_prompts"] == 12
    records = [json.loads(x) for x in (tmp_path / "s" / "prompts.jsonl").read_text().splitlines()]
    assert all(r["answer"] == r["prompt"].split("+")[0] and isinstance(r["answer"], str) for r in records)
    assert cli.main(["necessity", *common, "--out", str(tmp_path / "n")]) == 0
    assert cli.main(["lens", *common, "--out", str(tmp_path / "l")]) == 0
    lens = json.loads((tmp_path / "l" / "lens.json").read_text())
    assert lens["task"] == str(path) and lens["n_prompts"] == 12


def test_text_answers_run_through_search_and_lens(tmp_path):
    """Answers that are words (not numbers), on a random GPT-2-architecture stand-in (``tests/standins.py``) whose
    own top-1 words are written as the answers of a prompt file; the lens's numeric metrics are NaN for them
    (documented), nothing crashes."""
    from circuits.models import loading
    from tests import standins

    words = ["red", "blue", "green", "cat", "dog", "bird", "tree", "house", "car", "book"]
    prompts = [f"The {a} and the {b} are" for a in words for b in words]
    with standins.offline_cache(standins.build_cache(tmp_path / "hub", keys=["gpt2"])):
        model = loading.load_model("gpt2")
        enc = [model.to_tokens(p) for p in prompts]
        with torch.no_grad():
            top = [int(model(t)[0, -1].argmax()) for t in enc]
        rows = [{"prompt": p, "answer": model.tokenizer.decode([t])} for p, t in zip(prompts, top)]
        rows = [r for r in rows if not r["answer"].strip().isdigit() and r["answer"].strip()]
        assert len(rows) >= 40, len(rows)  # the test is about text answers
        path = _jsonl(tmp_path / "words.jsonl", rows)
        common = ["--model", "gpt2", "--prompts", str(path), "--n-prompts", "8", "--no-progress", "--batch-size", "16"]
        assert cli.main(["search", *common, "--fit-min-count", "2", "--out", str(tmp_path / "s")]) == 0
        assert cli.main(["necessity", *common, "--fit-min-count", "2", "--out", str(tmp_path / "n")]) == 0
        assert cli.main(["lens", *common, "--out", str(tmp_path / "l")]) == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["source"] == "prompts" and summary["base_accuracy"] == 1.0 and summary["task"] == str(path)
    records = [json.loads(x) for x in (tmp_path / "s" / "prompts.jsonl").read_text().splitlines()]
    truth = {r["prompt"]: r["answer"] for r in rows}
    assert len(records) == 8 and all(truth[r["prompt"]] == r["answer"] for r in records)
    lens = json.loads((tmp_path / "l" / "lens.json").read_text())
    assert lens["n_prompts"] == 8


def test_slot_columns_line_prompts_up_slot_by_slot(gpt2, tmp_path):
    """Rows of one token length whose slot values sit at other positions fall into separate layouts; a slot value
    missing from its prompt is one line naming the line and the column."""
    from circuits.prompts.datasets import slot_layouts
    from datasets import Dataset

    rows = [{"prompt": "The sum of 12 is", "answer": "5", "x": "The sum", "y": 12},
            {"prompt": "sum of 12 13 is", "answer": "5", "x": "sum", "y": "12 13"},
            {"prompt": "The sum of 7 is", "answer": "5", "x": "The sum", "y": 7}]
    ds = read_prompts(_jsonl(tmp_path / "s.jsonl", rows))
    (one,) = tasks.to_layouts(gpt2, ds)  # five tokens each (and BOS)
    split = slot_layouts([one], ds, gpt2, "s")
    assert [lay.prompts for lay in split] == [["The sum of 12 is", "The sum of 7 is"], ["sum of 12 13 is"]]
    bad = read_prompts(_jsonl(tmp_path / "b.jsonl", rows[:2] + [{**rows[2], "y": 71}]))
    with pytest.raises(ArgumentError, match=r"prompts b: line 3: column y: '71' does not occur in the prompt"):
        slot_layouts(tasks.to_layouts(gpt2, bad), bad, gpt2, "prompts b")
    plain = Dataset.from_list([{k: r[k] for k in ("prompt", "answer")} for r in rows])
    assert slot_layouts(tasks.to_layouts(gpt2, plain), read_prompts(plain), gpt2, "p")[0].n_pos == 6
