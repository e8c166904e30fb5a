"""Prompt formats (:mod:`circuits.tasks.formats`): solved examples before the query and the chat template, from the
Python API, the command line and sweep configs, and what the outputs say about the format used.

The real tokenizer's chat template (SmolLM2) is exercised in ``tests/checkpoints/test_real_model.py``; here a
tokenizer with a template written for the test shows what ``apply`` does with one."""

from __future__ import annotations

import argparse
import csv
import io
from types import SimpleNamespace

import pytest

from circuits import cli
from circuits.commands.common import specs_of
from circuits.errors import ArgumentError
from circuits.sweep import SweepConfig
from circuits.sweep.run import CellResult
from circuits.sweep.table import COLUMNS, csv_text, markdown
from circuits.tasks import catalogue as tasks
from circuits.tasks.formats import EXAMPLES_SEED, PromptFormat, describe_prompts


class TemplateTokenizer:
    """A tokenizer whose chat template wraps the user's message: ``<u>{message}</u><a>``."""

    chat_template = "test template"

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        assert messages[0]["role"] == "user" and len(messages) == 1 and not tokenize
        return f"<u>{messages[0]['content']}</u>" + ("<a>" if add_generation_prompt else "")


def test_the_zero_shot_format_is_the_task_itself():
    ds = tasks.build_task("add", n=20, seed=3)
    fmt = PromptFormat()
    assert fmt.zero_shot and fmt.prefix("add") == "" and fmt.examples("add") == []
    assert fmt.apply(ds, "add", TemplateTokenizer()) is ds
    assert fmt.describe() == "zero-shot" and fmt.prepend_bos(None) is None


def test_shots_put_the_same_solved_examples_before_every_query_and_never_ask_them():
    """The whole operand space of ``add_2d2d``: every prompt is the fixed prefix then the query; the rows whose
    operands are those of an example are left out, nothing else is, and the answers are unchanged."""
    fmt = PromptFormat(shots=3)
    drawn = tasks.build_task("add_2d2d", n=3, seed=EXAMPLES_SEED)  # the examples, drawn independently
    expected_prefix = "".join(f"{a}+{b}={a + b}\n" for a, b in drawn["operands"])
    assert fmt.prefix("add_2d2d") == expected_prefix and expected_prefix.count("\n") == 3
    space = tasks.operand_space_size("add_2d2d")
    ds = tasks.build_task("add_2d2d", n=space, seed=0)
    out = fmt.apply(ds, "add_2d2d", TemplateTokenizer())
    assert len(out) == space - 3
    shown = {tuple(o) for o in drawn["operands"]}
    kept = [(p, a, tuple(o)) for p, a, o in zip(ds["prompt"], ds["answer"], ds["operands"]) if tuple(o) not in shown]
    assert [(p, a, tuple(o)) for p, a, o in zip(out["prompt"], out["answer"], out["operands"])] == \
        [(expected_prefix + p, a, o) for p, a, o in kept]
    assert fmt.describe() == "3-shot" and not fmt.zero_shot


def test_the_examples_are_part_of_the_format_not_of_the_run_seed():
    """Two draws of prompts with different seeds share the prefix; another ``examples_seed`` changes it."""
    a = PromptFormat(shots=2).apply(tasks.build_task("add", n=5, seed=1), "add", None)
    b = PromptFormat(shots=2).apply(tasks.build_task("add", n=5, seed=2), "add", None)
    prefix = PromptFormat(shots=2).prefix("add")
    assert all(p.startswith(prefix) for p in [*a["prompt"], *b["prompt"]])
    assert PromptFormat(shots=2, examples_seed=1).prefix("add") != prefix


def test_the_chat_template_wraps_the_prefixed_query_and_drops_bos():
    fmt = PromptFormat(shots=1, chat=True)
    ds = tasks.build_task("add", n=4, seed=5)
    out = fmt.apply(ds, "add", TemplateTokenizer())
    prefix = fmt.prefix("add")
    queries = [p for p, o in zip(ds["prompt"], ds["operands"]) if tuple(o) != tuple(fmt.examples("add")[0]["operands"])]
    assert list(out["prompt"]) == [f"<u>{prefix}{q}</u><a>" for q in queries]
    assert fmt.describe() == "1-shot, chat template"
    # the template brings its own start token: no BOS unless asked for
    assert fmt.prepend_bos(None) is False and fmt.prepend_bos(True) is True
    model = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None))
    with pytest.raises(ArgumentError, match="no chat template; drop --chat"):
        PromptFormat(chat=True).apply(ds, "add", model)


@pytest.mark.parametrize("kwargs,flag", [({"shots": -1}, "--shots"), ({"shots": 65}, "--shots"),
                                         ({"shots": True}, "--shots"), ({"shots": "2"}, "--shots"),
                                         ({"chat": "yes"}, "--chat")])
def test_a_bad_format_is_one_line_naming_the_flag(kwargs, flag):
    with pytest.raises(ArgumentError) as err:
        PromptFormat(**kwargs).validate()
    assert flag in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("meta,text", [
    ({}, "zero-shot, single-token numbers (the AF1 papers' format)"),
    ({"numbers": "single"}, "zero-shot, single-token numbers (the AF1 papers' format)"),
    ({"format": {"shots": 2, "chat": False}}, "2-shot, single-token numbers"),
    ({"numbers": "multi", "format": {"shots": 2, "chat": True, "separator": "\n"}},
     "2-shot, chat template, numbers of several tokens (answers read under teacher forcing)"),
    ({"numbers": "multi"}, "zero-shot, numbers of several tokens (answers read under teacher forcing)"),
])
def test_describe_prompts_reads_a_run_description(meta, text):
    assert describe_prompts(meta) == text


def test_describe_prompts_says_what_a_task_file_adds(tmp_path):
    """A task file's own prefix and answer format are part of how its prompts read: the description says so,
    and never calls such prompts the papers' format."""
    body = 'name = "m"\ntemplate = "{A}+{B}="\nanswer = "A+B"\n[slots]\nA = { range = [0, 9] }\nB = { range = [0, 9] }\n'
    prefixed, spaced, plain = tmp_path / "p.toml", tmp_path / "s.toml", tmp_path / "plain.toml"
    prefixed.write_text('prefix = "1+1=2\\n"\n' + body)
    spaced.write_text('answer_format = " {}"\n' + body)
    plain.write_text(body)
    assert describe_prompts({"task": str(prefixed)}) == "zero-shot after the task file's prefix, single-token numbers"
    assert describe_prompts({"task": str(spaced)}) == "zero-shot, answers written as ' {}', single-token numbers"
    assert describe_prompts({"task": str(plain)}) == "zero-shot, single-token numbers (the AF1 papers' format)"
    assert (describe_prompts({"format": {"shots": 2}, "numbers": "multi"}, task=str(prefixed))
            == "2-shot after the task file's prefix, numbers of several tokens (answers read under teacher forcing)")
    # a task that no longer resolves (a moved file) or a caller's own prompts: the format keys alone
    assert describe_prompts({"task": str(tmp_path / "gone.toml")}) == describe_prompts({}) == describe_prompts(
        {"task": None})


def test_a_sweep_says_each_tasks_format(tmp_path):
    body = 'name = "m"\ntemplate = "{A}+{B}="\nanswer = "A+B"\n[slots]\nA = { range = [0, 9] }\nB = { range = [0, 9] }\n'
    (tmp_path / "p.toml").write_text('prefix = "1+1=2\\n"\n' + body)
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["arith-gpt2"]\ntasks = ["add", "p.toml"]\nn_prompts = 50\n')  # p has 100
    config = SweepConfig.from_toml(path)
    cells = [CellResult(model="arith-gpt2", task=t, ablation="cama", seed=0, base_accuracy=0.5, n_prompts=10, wait=3,
                        transfer=1, faithfulness=0.8, ci_low=0.7, ci_high=0.9, path="cells/x") for t in config.tasks]
    table = list(csv.DictReader(io.StringIO(csv_text(cells, config))))
    assert [r["prompt_format"] for r in table] == ["zero-shot, single-token numbers (the AF1 papers' format)",
                                                   "zero-shot after the task file's prefix, single-token numbers"]
    assert (f"prompts: add: zero-shot, single-token numbers (the AF1 papers' format); {config.tasks[1]}: zero-shot "
            "after the task file's prefix, single-token numbers.") in markdown(config, cells).splitlines()[0]


def parsed(*flags: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["search", "--model", "m", "--task", "add", "--out", "o", *flags])


def test_the_command_line_flags_make_the_format_and_run_json_records_it():
    spec = specs_of(parsed("--shots", "2", "--chat", "--numbers", "multi")).prompts
    assert spec.format == PromptFormat(shots=2, chat=True) and spec.numbers == "multi"
    assert spec.meta() == {"task": "add", "source": "build", "numbers": "multi",
                           "format": {"shots": 2, "chat": True, "separator": "\n", "examples_seed": EXAMPLES_SEED}}
    plain = specs_of(parsed()).prompts
    assert plain.format.zero_shot and plain.meta() == {"task": "add", "source": "build"}


def test_a_bad_shots_flag_is_refused_before_anything_loads(capsys, tmp_path, monkeypatch):
    from circuits import zoo
    from circuits.models import loading

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(zoo, "load", refuse)
    assert cli.main(["search", "--model", "arith-gpt2", "--task", "add", "--shots", "-2", "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err
    assert "--shots" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def sweep(tmp_path, body: str) -> SweepConfig:
    path = tmp_path / "sweep.toml"
    path.write_text('[sweep]\nmodels = ["arith-gpt2"]\ntasks = ["add_2d2d"]\n' + body)
    return SweepConfig.from_toml(path)


def test_sweep_keys_make_the_format_and_the_tables_say_it(tmp_path):
    config = sweep(tmp_path, 'numbers = "multi"\nshots = 2\nchat = true\n')
    spec = config.prompt_spec("add_2d2d", 0)
    assert spec.format == PromptFormat(shots=2, chat=True) and spec.numbers == "multi"
    identity = config.identity()
    assert (identity["shots"], identity["chat"], identity["numbers"]) == (2, True, "multi")
    rows = [CellResult(model="arith-gpt2", task="add_2d2d", ablation="cama", seed=0, base_accuracy=0.5, n_prompts=10,
                       wait=3, transfer=1, faithfulness=0.8, ci_low=0.7, ci_high=0.9, path="cells/x")]
    said = "2-shot, chat template, numbers of several tokens (answers read under teacher forcing)"
    table = list(csv.DictReader(io.StringIO(csv_text(rows, config))))
    assert list(table[0]) == list(COLUMNS) and table[0]["prompt_format"] == said
    assert f"prompts: {said}." in markdown(config, rows).splitlines()[0]
    plain = sweep(tmp_path, "")
    assert "prompts: zero-shot, single-token numbers (the AF1 papers' format)." in markdown(plain, rows)


def test_a_bad_sweep_format_key_is_one_line(tmp_path):
    with pytest.raises(ArgumentError, match="sweep key shots=-1 must be an integer in 0..64"):
        sweep(tmp_path, "shots = -1\n")
    with pytest.raises(ArgumentError, match="numbers"):
        sweep(tmp_path, 'numbers = "several"\n')
