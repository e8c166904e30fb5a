"""Task files: the catalogue as files (unchanged prompts and frozen sets), the expression evaluator, and every
task-file error as one line naming the file and the field."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from circuits import cli
from circuits.errors import ArgumentError, PromptError
from circuits.tasks import catalogue as tasks
from circuits.tasks import files as task_files

FIXTURE = Path(__file__).parent / "data" / "catalogue_tasks_json.json"
"""What the earlier one-file catalogue (``datasets/tasks.json``) built, recorded before it became task files."""


def _digest(ds) -> str:
    rows = [{"prompt": r["prompt"], "answer": r["answer"], "operands": r["operands"], "task": r["task"]} for r in ds]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def _write(tmp_path: Path, text: str, name: str = "task.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


MUL = 'name = "m"\ntemplate = "{A}*{B}="\nanswer = "A*B"\n[slots]\nA = { range = [0, 9] }\nB = { range = [0, 9] }\n'


# ------------------------------------------------------------------------------ the catalogue as files
def test_the_catalogue_files_build_what_tasks_json_built():
    before = json.loads(FIXTURE.read_text())
    assert tasks.list_tasks() == before["order"]
    for name, was in before["tasks"].items():
        spec = tasks.get_task(name)
        fields = (spec.template, spec.expression, list(spec.operand_names), [list(r) for r in spec.operand_ranges],
                  spec.answer_min, spec.answer_max, spec.default_n, spec.group, spec.style, spec.card)
        assert fields == (was["template"], was["expression"], was["operand_names"], was["operand_ranges"],
                          was["answer_min"], was["answer_max"], was["default_n"], was["group"], was["style"],
                          was["card"]), name
        assert tasks.operand_space_size(name) == was["space"], name
        ds = tasks.build_task(name)
        assert ds.column_names == ["prompt", "answer", "operands", "task"]
        assert _digest(ds) == was["default_sha256"], name
        assert _digest(tasks.build_task(name, n=50, seed=7, start=100)) == was["window_sha256"], name
        assert hashlib.sha256(tasks.frozen_path(name).read_bytes()).hexdigest() == was["frozen_sha256"], name


@pytest.mark.parametrize("n,seed,start", [(3240, 0, 0), (200, 0, 0), (57, 11, 1000)])
def test_add_2d2d_draws_from_an_independent_enumeration(n, seed, start):
    """add_2d2d (first a definition in tasks.json, now a task file): every pair of two-digit numbers with a
    two-digit sum, in lexicographic order, shuffled by numpy's permutation under the seed."""
    space = [(a, b) for a in range(10, 100) for b in range(10, 100) if 20 <= a + b <= 99]
    assert len(space) == 3240 == tasks.operand_space_size("add_2d2d")
    order = np.random.default_rng(seed).permutation(len(space))[start:start + n]
    ds = tasks.build_task("add_2d2d", n=n, seed=seed, start=start)
    assert [tuple(o) for o in ds["operands"]] == [space[i] for i in order]
    assert ds["prompt"] == [f"{space[i][0]}+{space[i][1]}=" for i in order]
    assert ds["answer"] == [sum(space[i]) for i in order]


def test_frozen_sets_regenerate_byte_for_byte(tmp_path, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(tasks.datasets_dir() / "tasks", data / "tasks")
    monkeypatch.setenv("AF1_DATASETS_DIR", str(data))
    names = ["add", "sub_sub", "python_sub", "add_3d1d", "add_2d2d"]
    written = tasks.write_frozen_sets(names)
    assert len(written) == 5
    shipped = tasks.datasets_dir() / "frozen"
    for name, path in zip(names, written):
        assert path.read_bytes() == (shipped / f"{name}.jsonl").read_bytes(), name


def test_a_task_file_equals_its_catalogue_task(tmp_path):
    path = _write(tmp_path, (tasks.datasets_dir() / "tasks" / "add_sub.toml").read_text())
    mine, shipped = tasks.get_task(str(path)), tasks.get_task("add_sub")
    assert mine.path == str(path) and mine.label == str(path)
    assert tasks.build_task(str(path), n=40, seed=3)["prompt"] == tasks.build_task("add_sub", n=40, seed=3)["prompt"]
    assert mine.template == shipped.template and mine.operand_ranges == shipped.operand_ranges


def test_json_task_files_load_too(tmp_path):
    path = _write(tmp_path, json.dumps({"name": "m", "template": "{A}*{B}=", "answer": "A*B",
                                        "slots": {"A": {"range": [2, 3]}, "B": {"range": [4, 4]}}}), "m.json")
    ds = tasks.build_task(str(path))
    assert sorted(ds["answer"]) == [8, 12] and sorted(ds["prompt"]) == ["2*4=", "3*4="]


# ------------------------------------------------------------------------------ expressions
@pytest.mark.parametrize("expr", ["A*B", "(A+B)*C - 2*A", "-A + B*(C-1)", "A-B-C", "3"])
def test_expressions_match_an_independent_computation(expr):
    rng = np.random.default_rng(0)
    a, b, c = (rng.integers(-50, 50, 200) for _ in range(3))
    got = task_files.evaluate(expr, {"A": a, "B": b, "C": c})
    want = [eval(expr, {}, {"A": int(x), "B": int(y), "C": int(z)}) for x, y, z in zip(a, b, c)]  # noqa: S307
    assert got.tolist() == want


@pytest.mark.parametrize("expr", ["A/B", "A**2", "A//B", "__import__('os')", "A.real", "abs(A)", "A if B else C",
                                  "A and B", "1.5*A", "[A]", "A; B"])
def test_expressions_outside_plus_minus_times_are_refused(tmp_path, expr):
    path = _write(tmp_path, MUL.replace('answer = "A*B"', f"answer = {json.dumps(expr)}"))
    with pytest.raises(ArgumentError) as err:
        tasks.load_task(path)
    assert str(path) in str(err.value) and ": answer:" in str(err.value) and "\n" not in str(err.value)


def test_a_multiplication_task_answers_and_bounds(tmp_path):
    path = _write(tmp_path, MUL.replace('answer = "A*B"', 'answer = "A*B"\nanswer_min = 10\nanswer_max = 20'))
    ds = tasks.build_task(str(path), n=100)
    pairs = {(a, b) for a in range(10) for b in range(10) if 10 <= a * b <= 20}
    assert {tuple(o) for o in ds["operands"]} == pairs
    assert all(r["answer"] == r["operands"][0] * r["operands"][1] for r in ds)
    assert all(r["prompt"] == f"{r['operands'][0]}*{r['operands'][1]}=" for r in ds)


def test_a_lookup_task_writes_its_answers_in_its_format(tmp_path):
    path = _write(tmp_path, 'name = "cap"\ntemplate = "{who}: the capital of {country} is"\nanswer_format = " {}"\n'
                            'prefix = "Facts.\\n"\n[slots]\nwho = { values = ["Ann", "Bo"] }\n'
                            'country = { values = ["France", "Japan"] }\n'
                            '[answer]\nlookup = "country"\ntable = { France = "Paris", Japan = "Tokyo" }\n')
    spec = tasks.get_task(str(path))
    assert not spec.numeric and spec.slot_values == (None,) * 0 + (("Ann", "Bo"), ("France", "Japan"))
    rows = tasks.build_task(str(path)).to_list()
    assert len(rows) == 4
    for r in rows:
        who, country = ("Ann", "Bo")[r["operands"][0]], ("France", "Japan")[r["operands"][1]]
        assert r["prompt"] == f"Facts.\n{who}: the capital of {country} is"
        assert r["answer"] == {"France": "Paris", "Japan": "Tokyo"}[country] and r["answer_text"] == " " + r["answer"]


# ------------------------------------------------------------------------------ one-line errors
BAD = [
    ("template", MUL.replace("{A}*{B}=", "{A}*{C}="), "unknown slot {C}"),
    ("answer", MUL.replace('"A*B"', '"A*D"'), "unknown slot 'D'"),
    ("slots.A.range", MUL.replace("[0, 9] }\nB", "[9, 0] }\nB"), "is empty"),
    ("slots.A.range", MUL.replace("[0, 9] }\nB", "[0] }\nB"), "two integers"),
    ("slots.A", MUL.replace("range = [0, 9] }\nB", "steps = 3 }\nB"), "either range"),
    ("slots.B", MUL.replace("{A}*{B}=", "{A}*2="), "not used in the template"),
    ("slots.A.values", MUL.replace("range = [0, 9] }\nB", "values = [] }\nB"), "is empty"),
    ("slots.A.values", MUL.replace("range = [0, 9] }\nB", "values = [1, 2] }\nB"), "not a non-empty string"),
    ("answer", MUL.replace("range = [0, 9] }\nB", 'values = ["x"] }\nB'), "holds strings"),
    ("answer.table.x", MUL.replace('answer = "A*B"', "").replace("range = [0, 9] }\nB", 'values = ["x"] }\nB')
     + '[answer]\nlookup = "A"\ntable = { x = 3 }\n', "answers are strings"),
    ("answer.table", MUL.replace('answer = "A*B"', "").replace("range = [0, 9] }\nB", 'values = ["x", "y"] }\nB')
     + '[answer]\nlookup = "A"\ntable = { x = "1" }\n', "no answer for A = 'y'"),
    ("answer.lookup", MUL.replace('answer = "A*B"', "") + '[answer]\nlookup = "A"\ntable = { x = "1" }\n',
     "integer range"),
    ("answer_format", MUL.replace('answer = "A*B"', 'answer = "A*B"\nanswer_format = " "'), "must hold the answer once"),
    ("colour", MUL.replace('name = "m"', 'name = "m"\ncolour = "red"'), "unknown key"),
    ("answer", MUL.replace('answer = "A*B"\n', ""), "missing"),
    ("template", MUL.replace("{A}*{B}=", "{A:3}*{B}="), "plain slot names"),
    ("answer_min", MUL.replace('answer = "A*B"', 'answer = "A*B"\nanswer_min = 5\nanswer_max = 4'), "above answer_max"),
]


@pytest.mark.parametrize("field,text,expected", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_every_task_file_error_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, field, text, expected):
    path = _write(tmp_path, text)
    with pytest.raises(ArgumentError) as err:
        tasks.load_task(path)
    message = str(err.value)
    assert message.startswith(f"task file {path}: {field}:") and expected in message and "\n" not in message, message
    # the command line says the same, on one line, with exit code 2 and before loading a model
    code = cli.main(["search", "--model", "arith-gpt2", "--task", str(path), "--out", str(tmp_path / "out")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"task file {path}: {field}:" in lines[0], lines


def test_unreadable_and_missing_task_files_are_one_line(tmp_path):
    path = _write(tmp_path, "name = \n")
    with pytest.raises(ArgumentError, match=f"task file {path} is not valid TOML"):
        tasks.load_task(path)
    with pytest.raises(ArgumentError, match="does not exist"):
        tasks.get_task(str(tmp_path / "nope.toml"))
    with pytest.raises(ArgumentError, match="or the path of a task file"):
        tasks.get_task("nope")


def test_a_task_whose_answers_are_never_one_token_says_so(tmp_path):
    from circuits import zoo
    from circuits.prompts.sampling import prepare_prompts

    path = _write(tmp_path, 'name = "w"\ntemplate = "{A}+{B}="\n[slots]\nA = { values = ["1", "2"] }\n'
                            'B = { values = ["3", "4", "5", "6", "7"] }\n'
                            '[answer]\nlookup = "A"\ntable = { 1 = "Paris", 2 = "Rome" }\n')
    model = zoo.load("arith-gpt2")
    with pytest.raises(PromptError) as err:
        prepare_prompts(model, str(path), 3, progress=False)
    assert f"task file {path}: answer:" in str(err.value) and "one token" in str(err.value)


def test_slots_that_cannot_line_up_are_named(tmp_path):
    from circuits.tasks.checks import check_slot_tokens
    from circuits.zoo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    two = 'name = "t"\ntemplate = "{x} and {y}="\n[answer]\nlookup = "x"\ntable = { "1" = "1", "2 3" = "2" }\n[slots]\n'
    path = _write(tmp_path, two + 'x = { values = ["1", "2 3"] }\ny = { values = ["4", "5 6"] }\n')
    with pytest.raises(ArgumentError, match=f"task file {path}: slots.x: values take different numbers of tokens"):
        check_slot_tokens(tasks.load_task(path), tok)
    one = _write(tmp_path, two + 'x = { values = ["1", "2 3"] }\ny = { values = ["4", "5"] }\n', "one.toml")
    check_slot_tokens(tasks.load_task(one), tok)  # one varying slot: its prompts are grouped by length


# ------------------------------------------------------------------------------ sweep configs
def test_sweep_configs_take_task_files_relative_to_the_config(tmp_path):
    from circuits.sweep.config import SweepConfig

    (tmp_path / "tasks").mkdir()
    _write(tmp_path / "tasks", MUL, "mul.toml")
    cfg = tmp_path / "sweep.toml"
    # n_prompts at most mul's 100 prompts (more is refused before anything loads: test_refused_before_loading.py)
    cfg.write_text('[sweep]\nmodels = ["arith-gpt2"]\ntasks = ["add", "tasks/mul.toml"]\nn_prompts = 50\n')
    config = SweepConfig.from_toml(cfg)
    assert config.tasks == ("add", str(tmp_path / "tasks" / "mul.toml"))
    assert [str(c.folder()) for c in config.cells()] == ["arith-gpt2/add/cama-seed0", "arith-gpt2/mul/cama-seed0"]
    # af1 sweep --config reads the same tasks, from any working directory
    from circuits.cli import build_parser
    from circuits.commands.sweep import spec

    args = build_parser().parse_args(["sweep", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert spec(args).config == config
    (tmp_path / "tasks" / "bad.toml").write_text(MUL.replace('"A*B"', '"A/B"'))
    cfg.write_text('[sweep]\nmodels = ["arith-gpt2"]\ntasks = ["tasks/bad.toml"]\n')
    with pytest.raises(ArgumentError, match=r"bad.toml: answer:"):
        SweepConfig.from_toml(cfg)


def test_frozen_sets_of_task_files(tmp_path):
    from circuits.commands.common import check_task

    path = _write(tmp_path, MUL.replace('answer = "A*B"', 'answer = "A*B"\nfrozen_n = 7\nfrozen_seed = 3'))
    with pytest.raises(ArgumentError, match="has no frozen set at .*task.frozen.jsonl"):
        check_task(str(path), 5, "frozen")
    (written,) = tasks.write_frozen_sets([str(path)])
    assert written == tmp_path / "task.frozen.jsonl"
    fz = tasks.frozen_set(str(path))
    assert fz["prompt"] == tasks.build_task(str(path), n=7, seed=3)["prompt"] and len(fz) == 7
    check_task(str(path), 5, "frozen")


def test_the_multiplication_example_keeps_its_frozen_set_out_of_training():
    from circuits.zoo.data import build_splits
    from circuits.zoo.recipes import get_config
    from circuits.zoo.tokenizer import WORDS, build_tokenizer

    cfg = get_config("arith-mul")
    train, val = build_splits(cfg, build_tokenizer(words=[*WORDS, *cfg.extra_tokens]))
    frozen = {tuple(o) for o in tasks.frozen_set("examples/mul.toml")["operands"]}
    seen = {tuple(int(x) for x in o) for d in train + val for o in d.ops}
    assert len(frozen) == 300 and not frozen & seen
    assert len(seen) + len(frozen) == tasks.operand_space_size("examples/mul.toml")
    assert all(int(a) == int(o[0]) * int(o[1]) for d in train for o, a in zip(d.ops, d.answer_values))


def test_arith_mul_meets_its_bar_on_the_frozen_set():
    from circuits import zoo
    from circuits.zoo.data import evaluate_frozen

    model, card = zoo.load("arith-mul"), zoo.card("arith-mul")
    assert model.to_str_tokens("12*34=") == ["<bos>", "12", "*", "34", "="]
    acc = evaluate_frozen(model, ["examples/mul.toml"])["examples/mul.toml"]
    assert acc == pytest.approx(card["frozen_accuracy"]["examples/mul.toml"], abs=1 / 600) and acc >= 0.95
    # the independent path: text prompts through the tokenizer, answers compared as tokens
    fz = tasks.frozen_set("examples/mul.toml")
    assert tasks.filter_correct(model, fz)[1] == pytest.approx(acc, abs=1e-9)
    assert all(a == o[0] * o[1] <= 520 for a, o in zip(fz["answer"], fz["operands"]))
    assert not (zoo.path("arith-mul") / "unembed_bias.safetensors").exists()  # a plain lm_head, no bias


def test_af1_search_on_a_task_file(tmp_path):
    code = cli.main(["search", "--model", "arith-mul", "--task", "examples/mul.toml", "--n-prompts", "40",
                     "--no-progress", "--out", str(tmp_path / "s")])
    assert code == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["task"] == "examples/mul.toml" and summary["n_prompts"] == 40
    for line in (tmp_path / "s" / "prompts.jsonl").read_text().splitlines():
        r = json.loads(line)
        a, b = (int(x) for x in r["prompt"].rstrip("=").split("*"))
        assert r["answer"] == a * b


def test_the_capital_example_and_its_prompt_file_agree():
    spec = tasks.get_task("examples/capital.toml")
    ds = tasks.build_task(spec)
    assert len(ds) == 342 == tasks.operand_space_size(spec) == 9 * 38
    rows = [json.loads(x) for x in (tasks.datasets_dir() / "examples" / "capital.jsonl").read_text().splitlines()]
    assert {(r["prompt"], r["answer"]) for r in rows} == set(zip(ds["prompt"], ds["answer_text"]))
    table = dict(spec.lookup[1])
    assert table["France"] == "Paris" and table["Japan"] == "Tokyo"
    for r in rows:
        assert r["prompt"] == f"{r['name']} lives in {r['country']}. The capital of {r['country']} is"
        assert r["answer"] == " " + table[r["country"]]


def test_solved_examples_of_a_task_file_follow_its_prefix_and_answer_format(tmp_path):
    from circuits.tasks.formats import PromptFormat
    from circuits.zoo.tokenizer import build_tokenizer

    path = str(_write(tmp_path, MUL.replace('answer = "A*B"', 'answer = "A*B"\nprefix = "Go: "\nanswer_format = " {}"')))
    fmt = PromptFormat(shots=2)
    shown = fmt.examples(path)
    assert [e["answer_text"] for e in shown] == [f" {e['answer']}" for e in shown]
    ds = tasks.build_task(path, n=20, seed=1)
    out = fmt.apply(ds, path, build_tokenizer())
    head = "Go: " + "".join(f"{e['prompt']} {e['answer']}\n" for e in shown)
    kept = [r for r in ds if tuple(r["operands"]) not in {tuple(e["operands"]) for e in shown}]
    assert out["prompt"] == [head + r["prompt"][len("Go: "):] for r in kept]
    assert all(not e["prompt"].startswith("Go: ") for e in shown)
