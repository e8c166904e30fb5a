"""Input files and task expressions: every surface a careless or hostile file reaches (size, depth, encoding,
duplicates, integer range) answered with the right prompts and answers or one line with exit code 2 before the
model loads; answers exact beyond 64 bits; a prompt dataset's means fitted on a separate fit set."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from circuits import cli, zoo
from circuits.errors import ArgumentError, PromptError
from circuits.prompts.datasets import read_prompts
from circuits.prompts.fitspec import FitSpec
from circuits.prompts.spec import PromptSpec
from circuits.tasks import catalogue as tasks
from circuits.tasks.files import spec_fields

MODEL = ["--model", "arith-gpt2"]


@pytest.fixture(scope="module")
def gpt2():
    return zoo.load("arith-gpt2")


def refused(capsys, tmp_path: Path, *args: str) -> str:
    """The one line ``af1 search`` prints for ``args`` (exit 2, no traceback, nothing loaded, nothing written)."""
    out = tmp_path / "out"
    code = cli.main(["search", *MODEL, *args, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert not out.exists()  # refused before the run directory (and the model)
    return lines[0].removeprefix("af1 search: error: ")


def task_file(tmp_path: Path, text: str, name: str = "t.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def add_rows(n: int, seed: int = 5) -> list[dict]:
    ds = tasks.build_task("add", n=n, seed=seed)
    return [{"prompt": r["prompt"], "answer": r["answer"], "A": r["operands"][0], "B": r["operands"][1]} for r in ds]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- line ends: the CSV reader sees the whole file; Unicode line separators are text -------------------------------
def test_a_quoted_newline_in_a_csv_prompt_is_kept(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('prompt,answer\n"Q:\n60+53=",113\n"Q:\r\n1+2=",3\n7+8=,15\n', newline="")
    ds = read_prompts(path)
    assert ds["prompt"] == ["Q:\n60+53=", "Q:\r\n1+2=", "7+8="]
    assert ds["_line"] == ["line 2", "line 4", "line 6"]  # where each record starts


@pytest.mark.parametrize("sep", ["\u2028", "\u0085", "\u2029", "\x0b", "\x0c", "\x1c"])
@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_unicode_line_separators_in_valid_files_are_text(tmp_path, sep, kind):
    prompts = [f"a{sep}1+2=", "3+4=", "5+6="]
    path = tmp_path / f"p.{kind}"
    if kind == "jsonl":
        path.write_text("".join(json.dumps({"prompt": p, "answer": 1}, ensure_ascii=False) + "\n" for p in prompts),
                        encoding="utf-8")
    else:
        path.write_text("prompt,answer\n" + "".join(f"{p},1\n" for p in prompts), encoding="utf-8", newline="")
    ds = read_prompts(path)
    assert ds["prompt"] == prompts
    first = 1 if kind == "jsonl" else 2
    assert ds["_line"] == [f"line {first + i}" for i in range(3)]
    # and a problem after the separator is named at its own line
    bad = path.read_text(encoding="utf-8").replace("5+6=", "")
    path.write_text(bad, encoding="utf-8", newline="")
    with pytest.raises(ArgumentError, match=rf"line {first + 2}: column prompt"):
        read_prompts(path)


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_jsonl_lines_end_as_an_editor_ends_them(tmp_path, end):
    path = tmp_path / "p.jsonl"
    path.write_bytes(end.join(['{"prompt": "1+2=", "answer": 3}', "", '{"prompt": "2+2=", "answer": 4}', ""]).encode())
    ds = read_prompts(path)
    assert ds["prompt"] == ["1+2=", "2+2="] and ds["_line"] == ["line 1", "line 3"]


# --- exact answers --------------------------------------------------------------------------------------------------
PRODUCT = 'name = "m4"\ntemplate = "{A}*{B}*{C}*{D}="\nanswer = "A*B*C*D"\n%s[slots]\n' + "".join(
    f"{k} = {{ range = [%d, %d] }}\n" for k in "ABCD")


def test_answers_beyond_64_bits_are_refused_without_bounds(tmp_path, capsys):
    path = task_file(tmp_path, PRODUCT % (("",) + (90000, 99999) * 4))
    line = refused(capsys, tmp_path, "--task", str(path))
    assert line.startswith(f"task file {path}: answer: can reach '99996000059999600001'"), line
    assert "answer_max" in line


def test_answers_are_exact_and_bounds_apply_to_exact_values(tmp_path):
    # 4 factors near 31622: products up to about 1e18, past int32 and near int64, every one exact
    spec = tasks.get_task(task_file(tmp_path, PRODUCT % (("answer_max = 1000000000000000000\n",) + (30000, 39999) * 4)))
    ds = tasks.build_task(spec, n=50, seed=3)
    assert len(ds) == 50
    for r in ds:
        a, b, c, d = r["operands"]
        assert r["answer"] == a * b * c * d <= 10 ** 18
    # 90000..99999: every product is above 6.5e19; wrapped around 64 bits, some would fall inside the bounds
    bounded = PRODUCT % (("answer_max = 1000000000000000000\n",) + (90000, 99999) * 4)
    wrapped = tasks.get_task(task_file(tmp_path, bounded, "w.toml"))
    assert wrapped.answer([96369, 98599, 98286, 96469]) == 96369 * 98599 * 98286 * 96469
    with pytest.raises(ArgumentError, match="yield no prompt with an answer in"):
        tasks.build_task(wrapped, n=5)


# --- duplicate keys and rows ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ('{"name": "t", "template": "{A}+{B}=", "answer": "A+B",\n "slots": {"A": {"range": [0, 9]},\n'
     ' "B": {"range": [0, 9]},\n "A": {"range": [0, 5]}}}', "line 4: key 'A' is given twice"),
    ('{"name": "t", "template": "{A}=", "answer": "A",\n "slots": {"A": {"range": [0, 9]}},\n "answer": "A+1"}',
     "line 3: key 'answer' is given twice"),
])
def test_a_json_task_file_with_a_key_twice_is_refused(tmp_path, capsys, text, expected):
    path = task_file(tmp_path, text, "t.json")
    line = refused(capsys, tmp_path, "--task", str(path))
    assert line.startswith(f"task file {path}: {expected}"), line


def test_a_toml_task_file_with_a_key_twice_is_refused(tmp_path, capsys):
    path = task_file(tmp_path, 'name = "t"\ntemplate = "{A}="\nanswer = "A"\nanswer = "A+1"\n'
                               '[slots]\nA = { range = [0, 9] }\n')
    assert "is not valid TOML" in refused(capsys, tmp_path, "--task", str(path))


@pytest.mark.parametrize("name,text,expected", [
    ("p.csv", "prompt,answer,answer\n1+2=,3,4\n", "line 1: header names column 'answer' twice"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n{"prompt": "1+3=", "answer": 4, "answer": 5}\n',
     "line 2: key 'answer' is given twice"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n{"prompt": "2+2=", "answer": 4}\n{"prompt": "1+2=", "answer": 3}\n',
     "line 3: column prompt: '1+2=' repeats line 1"),
    ("p.csv", "prompt,answer\n1+2=,3\n2+2=,4\n1+2=,5\n", "line 4: column prompt: '1+2=' repeats line 2"),
    ("p.csv", "prompt,answer\n1+2=,3,9\n", "line 2: 3 fields, but the header names 2 columns"),
])
def test_duplicate_columns_keys_and_prompts_are_refused(tmp_path, capsys, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    line = refused(capsys, tmp_path, "--prompts", str(path))
    assert line.startswith(f"prompts file {path}: {expected}"), line


# --- task expressions -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("answer,reason", [
    ("-" * 100_000 + "A", "the expression is 100001 characters long, more than 1000"),
    ("+".join(["A"] * 200_000), "the expression is 399999 characters long, more than 1000"),
    ("(" * 5000 + "A" + ")" * 5000, "the expression is 10001 characters long, more than 1000"),
    ("(" * 250 + "A" + ")" * 250, "not an expression (too many nested parentheses)"),
    ("-" * 300 + "A", "the expression nests 302 levels deep, more than 64"),
    ("A+" + "9" * 30, "the constant '999999999999999999999999999999' is beyond +-10^18"),
])
def test_hostile_expressions_are_refused_with_the_reason_first(tmp_path, capsys, answer, reason):
    path = task_file(tmp_path, 'name = "t"\ntemplate = "{A}="\nanswer = "' + answer + '"\n[slots]\n'
                               'A = { range = [0, 9] }\n')
    started = time.perf_counter()
    line = refused(capsys, tmp_path, "--task", str(path))
    assert line.startswith(f"task file {path}: answer: {reason}"), line[:300]
    assert len(line) < 400 and time.perf_counter() - started < 10


@pytest.mark.parametrize("slots,field", [
    ('A = { range = [0, 1000000000000000000000000000000] }', "slots.A.range"),
    ('A = { range = [0, %s] }' % ("1" * 5000), "an integer has more digits"),
])
def test_integers_beyond_64_bits_in_a_task_file_are_refused(tmp_path, capsys, slots, field):
    path = task_file(tmp_path, 'name = "t"\ntemplate = "{A}="\nanswer = "A"\n[slots]\n' + slots + "\n")
    line = refused(capsys, tmp_path, "--task", str(path))
    assert line.startswith(f"task file {path}: ") and field in line, line
    as_json = task_file(tmp_path, '{"name": "t", "template": "{A}=", "answer": "A", "slots": {"A": {"range": '
                                  '[0, 1000000000000000000000000000000]}}}', "t.json")
    line = refused(capsys, tmp_path, "--task", str(as_json))
    expected = f"task file {as_json}: line 1: the integer '1000000000000000000000000000000' is beyond"
    assert line.startswith(expected), line


def test_bounds_beyond_64_bits_are_refused():
    raw = {"name": "t", "template": "{A}=", "answer": "A", "slots": {"A": {"range": [0, 9]}}, "answer_max": 10 ** 30}
    with pytest.raises(ArgumentError, match=r"^task file t.toml: answer_max: '1000000000000000000000000000000' is"):
        spec_fields(raw, "t.toml")


# --- numbers that are never one token -------------------------------------------------------------------------------
def test_a_task_whose_numbers_are_never_one_token_stops_and_says_why(gpt2, tmp_path, monkeypatch):
    """The bound on drawing, for a tokenizer that reads large numbers as several known tokens (no ``<unk>``): this
    test's tokenizer reads them as ``<unk>``, which the earlier check of unknown numbers refuses
    (tests/circuits/test_number_tokens.py), so that check is switched off here to reach the drawing."""
    from circuits.prompts import sampling

    monkeypatch.setattr(sampling, "check_number_tokens", lambda spec, model: None)
    assert sampling.DRY_DRAWS == 20_000
    path = task_file(tmp_path, 'name = "big"\ntemplate = "{A}+{B}="\nanswer = "A+B"\n[slots]\n'
                               'A = { range = [0, 999999999] }\nB = { range = [0, 999999999] }\n')
    started = time.perf_counter()
    with pytest.raises(PromptError) as err:
        sampling.prepare_prompts(gpt2, str(path), 20, progress=False)
    message = str(err.value)
    assert time.perf_counter() - started < 60
    assert message.startswith(f"task file {path}: slots: none of the ") and "single-token numbers" in message
    assert "none of the 20000 drawn prompts" in message and "drawing stops after 20000 without one" in message
    assert "narrow the slot ranges" in message and "--numbers multi" in message and len(message) < 400


# --- prompt files: size, encoding, integers, depth ------------------------------------------------------------------
LONG = 131_073


@pytest.mark.parametrize("name,content,expected", [
    ("p.csv", "prompt,answer\n1+2=,3\n" + "x" * LONG + ",3\n",
     "line 3: not CSV (a field is longer than 131072 characters"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n' + json.dumps({"prompt": "x" * LONG, "answer": 3}) + "\n",
     "line 2: column prompt: 131073 characters, more than the 131072"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 1000000000000000000000000000000}\n',
     "line 1: the integer '1000000000000000000000000000000' is beyond +-10^18"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3}\n{"prompt": "1+3=", "answer": ' + "7" * 5000 + "}\n",
     "line 2: the integer '" + "7" * 40 + "'... (5000 characters) is beyond"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
     "line 1: a value is nested deeper than 32 levels"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3, "x": ' + "[" * 40 + "]" * 40 + "}\n",
     "line 1: a value is nested deeper than 32 levels"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": 3, "x": {"y": 1}}\n',
     "line 1: column x: '{\"y\": 1}' is not a slot value"),
    ("p.jsonl", '{"prompt": "1+2=", "answer": NaN}\n', "line 1: NaN is not a JSON number"),
    ("p.jsonl", b'{"prompt": "1+2=", "answer": 3}\n{"prompt": "1+\xff=", "answer": 3}\n',
     "line 2: not UTF-8 text (byte 0xff)"),
    ("p.csv", "prompt,answer\n1+2=,3\n".encode("utf-16"), "line 1: not UTF-8 text (byte 0xff)"),
])
def test_hostile_prompt_files_are_one_line_naming_file_and_line(tmp_path, capsys, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    line = refused(capsys, tmp_path, "--prompts", str(path))
    assert line.startswith(f"prompts file {path}: {expected}"), line[:300]


def test_a_huge_prompts_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    from circuits.prompts import prompt_files

    monkeypatch.setattr(prompt_files, "MAX_PROMPTS_FILE", 1000)
    path = jsonl(tmp_path / "p.jsonl", add_rows(100))
    line = refused(capsys, tmp_path, "--prompts", str(path))
    assert line == f"prompts file {path} is larger than 1,000 bytes, the most a prompts file may hold: split it into " \
                   f"smaller files"


def test_a_pipe_or_a_directory_is_refused_without_reading(tmp_path, capsys):
    import os

    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    assert refused(capsys, tmp_path, "--prompts", str(fifo)) == (f"prompts file {fifo} is not a regular file (a pipe "
                                                                 f"or a device): give the path of a file")
    folder = tmp_path / "t.toml"
    folder.mkdir()
    assert refused(capsys, tmp_path, "--task", str(folder)).startswith(f"task file {folder} is a directory")


def test_a_byte_order_mark_is_accepted_in_csv_jsonl_and_toml(tmp_path):
    bom = "\ufeff"
    csv = tmp_path / "p.csv"
    csv.write_text(bom + "prompt,answer\n1+2=,3\n", encoding="utf-8")
    assert read_prompts(csv)["prompt"] == ["1+2="]
    lines = tmp_path / "p.jsonl"
    lines.write_text(bom + '{"prompt": "1+2=", "answer": 3}\n', encoding="utf-8")
    assert read_prompts(lines)["answer"] == [3]
    toml = tmp_path / "t.toml"
    toml.write_text(bom + 'name = "t"\ntemplate = "{A}="\nanswer = "A"\n[slots]\nA = { range = [0, 9] }\n',
                    encoding="utf-8")
    assert tasks.get_task(str(toml)).template == "{A}="
    js = tmp_path / "t.json"
    js.write_text(bom + '{"name": "t", "template": "{A}=", "answer": "A", "slots": {"A": {"range": [0, 9]}}}',
                  encoding="utf-8")
    assert tasks.get_task(str(js)).operand_ranges == ((0, 9),)


def test_a_task_file_that_is_not_utf8_or_too_large_is_one_line(tmp_path, capsys):
    path = tmp_path / "t.toml"
    path.write_bytes(b'name = "t\xe9"\n')
    assert refused(capsys, tmp_path, "--task", str(path)).startswith(f"task file {path}: line 1: not UTF-8 text")
    path.write_text('name = "t"\ncard = "' + "x" * (1 << 20) + '"\n')
    assert refused(capsys, tmp_path, "--task", str(path)).startswith(f"task file {path} is larger than 1,048,576")


@pytest.mark.parametrize("line,expected", [
    ('{"prompt": "1+2=", "answer": 3, "operands": [1, 2]}', "line 2: must be a JSON object with prompt, answer"),
    ('{"prompt": "1+2=", "answer": 3, "operands": [1], "task": "t"}', "line 2: operands: must be a list of 2"),
    ('{"prompt": "1+2=", "answer": 3, "answer": 4, "operands": [1, 2], "task": "t"}', "line 2: key 'answer' is given"),
])
def test_a_task_files_frozen_set_is_read_as_a_prompts_file(tmp_path, capsys, line, expected):
    frozen = tmp_path / "t.frozen.jsonl"
    frozen.write_text('{"prompt": "1+1=", "answer": 2, "operands": [1, 1], "task": "t"}\n' + line + "\n")
    path = task_file(tmp_path, 'name = "t"\ntemplate = "{A}+{B}="\nanswer = "A+B"\n[slots]\n'
                               'A = { range = [0, 9] }\nB = { range = [0, 9] }\n')
    out = refused(capsys, tmp_path, "--task", str(path), "--source", "frozen", "--n-prompts", "1")
    assert out.startswith(f"frozen set {frozen}: {expected}"), out


# --- a fit set for a prompts file -----------------------------------------------------------------------------------
def test_a_small_prompts_file_is_told_to_give_a_fit_set(gpt2, tmp_path, capsys):
    """250 rows over 0..99: each value in 2 or 3 rows, none backed 5 times; the refusal names the fit set flags, not
    'lower --n-prompts to 0'."""
    path = jsonl(tmp_path / "small.jsonl", add_rows(250))
    with pytest.raises(PromptError) as err:
        PromptSpec(prompts=str(path), n_prompts=200).prepare(gpt2, means="cama", progress=False)
    message = str(err.value)
    assert "--fit-prompts FILE.jsonl|csv" in message and "--fit-prompts TASK.toml" in message, message
    assert "--fit-min-count" in message and "to 0 or less" not in message
    # printed whole, not cut, for a path of up to 90 characters (pytest's own tmp_path varies in length)
    assert len(f"af1 search: error: {message}") - len(str(path)) + 90 <= 400, message
    # and as the command line prints it (exit 2, one line)
    code = cli.main(["search", *MODEL, "--prompts", str(path), "--out", str(tmp_path / "o"), "--no-progress"])
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err_lines == [f"af1 search: error: {message}"]


def fitted_means(out: Path):
    import interventions as iv

    return iv.MeanCache.load(out / "means.safetensors")


def scored_prompts(out: Path) -> list[str]:
    return [json.loads(x)["prompt"] for x in (out / "prompts.jsonl").read_text().splitlines()]


def layout_tokens(model, prompts: list[str], n_pos: int, leave_out: list[str]) -> torch.Tensor:
    """BOS and the tokenizer's ids of each prompt of ``n_pos`` tokens, in order, without ``leave_out``."""
    rows = [[model.tokenizer.bos_token_id] + model.tokenizer(p, add_special_tokens=False)["input_ids"]
            for p in prompts if p not in set(leave_out)]
    return torch.tensor([r for r in rows if len(r) == n_pos])


def assert_same_means(cache, expected) -> None:
    assert cache.n_prompts == expected.n_prompts
    ours, theirs = cache.tensors(), expected.tensors()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_means_fitted_from_fit_prompts_are_the_means_of_those_prompts(gpt2, tmp_path, capsys):
    import interventions as iv

    rows = add_rows(250)
    seen = {r["prompt"] for r in rows}
    fit_rows = [r for r in add_rows(3000, seed=11) if r["prompt"] not in seen][:2000]
    small = jsonl(tmp_path / "small.jsonl", rows)
    fit = jsonl(tmp_path / "fit.jsonl", fit_rows)
    out = tmp_path / "s"
    args = ["search", *MODEL, "--prompts", str(small), "--fit-prompts", str(fit), "--n-prompts", "30",
            "--no-progress", "--out", str(out)]
    assert cli.main(args) == 0
    scored = scored_prompts(out)
    assert len(scored) == 30 and set(scored) <= seen
    n_pos = len(gpt2.tokenizer(scored[0], add_special_tokens=False)["input_ids"]) + 1
    expected = layout_tokens(gpt2, [r["prompt"] for r in fit_rows], n_pos, scored)
    assert 1000 < len(expected) <= 2000
    assert_same_means(fitted_means(out), iv.MeanCache.fit(gpt2, expected, progress=False))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fit"]["fit"]["task"] == str(fit) and summary["fit"]["fit"]["n_fit"] == len(expected)
    assert f"means: fitted on {len(expected)} prompts of {fit} (the whole layout" in capsys.readouterr().out
    # the same command resumes; a fit file changed under its path is refused, never mixed with the old means
    assert cli.main(args) == 0
    capsys.readouterr()
    jsonl(fit, fit_rows[:-1])
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "means.fit.sha256" in err[0], err


def test_the_fit_set_drawn_from_a_task_file_is_its_prompts_in_the_layout(gpt2, tmp_path):
    rows = add_rows(250)
    task = task_file(tmp_path, 'name = "add99"\ntemplate = "{A}+{B}="\nanswer = "A+B"\n[slots]\n'
                               'A = { range = [0, 99] }\nB = { range = [0, 99] }\n')
    small = jsonl(tmp_path / "small.jsonl", rows)
    spec = PromptSpec(prompts=str(small), fit_prompts=str(task), n_prompts=30, fit=FitSpec(size=2000, seed=3))
    prompts = spec.prepare(gpt2, means="cama", progress=False)
    drawn = tasks.build_task(str(task), n=2000, seed=3)  # the first 2000 of the task's prompts in seed 3's order
    expected = layout_tokens(gpt2, list(drawn["prompt"]), prompts.tokens.shape[1], prompts.prompts)
    assert torch.equal(prompts.fit.tokens, expected) and prompts.fit.task == str(task)  # fitted as in the test above
    # a task without the prompts' slot columns is refused, naming the column
    other = task_file(tmp_path, 'name = "x"\ntemplate = "{X}+{B}="\nanswer = "X+B"\n[slots]\n'
                                'X = { range = [0, 99] }\nB = { range = [0, 99] }\n', "x.toml")
    # a catalogue name is a task too: `add` (0..99, slots A and B) gives the prompts of its own order
    catalogue = PromptSpec(prompts=str(small), fit_prompts="add", n_prompts=30, fit=FitSpec(size=2000, seed=3))
    drawn, got = tasks.build_task("add", n=2000, seed=3), catalogue.prepare(gpt2, means="cama", progress=False)
    expected = layout_tokens(gpt2, list(drawn["prompt"]), got.tokens.shape[1], got.prompts)
    assert torch.equal(got.fit.tokens, expected) and got.fit.task == "add"
    with pytest.raises(ArgumentError, match="the task has no slot 'A', a slot column of --prompts"):
        PromptSpec(prompts=str(small), fit_prompts=str(other), n_prompts=30).prepare(gpt2, means="cama",
                                                                                      progress=False)


def test_fit_prompts_are_checked_before_loading(tmp_path, capsys):
    small = jsonl(tmp_path / "small.jsonl", add_rows(250))
    bad = tmp_path / "fit.csv"
    bad.write_text("prompt,answer,answer\n")
    line = refused(capsys, tmp_path, "--prompts", str(small), "--fit-prompts", str(bad))
    assert line.startswith(f"prompts file {bad}: line 1: header names column 'answer' twice"), line
    line = refused(capsys, tmp_path, "--task", "add", "--fit-prompts", str(small))
    assert line.startswith("--fit-prompts (fit_prompts=) gives the means of a prompt dataset"), line
