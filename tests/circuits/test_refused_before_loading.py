"""Settings a task or a sweep cannot honour are refused before any model loads, in one line with exit code 2:
more prompts than a frozen set holds, than a task has for `af1 groundtruth`, more solved examples (`--shots`)
than a task has, an invalid sweep value (docs/reliability.md, "Models, run directories and signals")."""

from __future__ import annotations

from pathlib import Path

import pytest

from circuits import cli, zoo
from circuits.models import loading
from circuits.models.spec import ModelSpec
from tests.circuits.test_reliability2 import one_line_error

SMALL = """name = "tiny_add"
template = "{A}+{B}="
answer = "A+B"

[slots]
A = { range = [0, 2] }
B = { range = [0, 1] }
"""
"""A task of 6 distinct prompts."""


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(zoo, "load", refuse)
    monkeypatch.setattr(zoo, "load_dir", refuse)
    monkeypatch.setattr(ModelSpec, "load", refuse)


def sweep_config(tmp_path: Path, name: str, **keys: str) -> str:
    path = tmp_path / f"{name}.toml"
    body = {"models": '["arith-gpt2"]', "tasks": '["add"]', "n_prompts": "10", **keys}
    path.write_text("[sweep]\n" + "".join(f"{k} = {v}\n" for k, v in body.items()))
    return str(path)


def cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    task = tmp_path / "tiny_add.toml"
    task.write_text(SMALL)
    return {
        "frozen set smaller": (["search", "--model", "arith-gpt2", "--task", "add", "--source", "frozen",
                                "--n-prompts", "5000"], "--n-prompts 5000 exceeds the 300 prompts of task 'add''s "
                                                        "frozen set (add.jsonl); give at most 300, or --source build"),
        "groundtruth absurd count": (["groundtruth", "--n-prompts", "100000000"],
                                     "--n-prompts 100000000 is out of range: give an integer 1..100000"),
        "groundtruth more than the task": (["groundtruth", "--tasks", "add", "--n-prompts", "20000"],
                                           "--n-prompts 20000 exceeds the 10000 distinct prompts of task 'add'"),
        "shots the whole task": (["search", "--model", "arith-gpt2", "--task", str(task), "--shots", "6",
                                  "--n-prompts", "1"], "--shots 6 needs more solved examples than task"),
        "shots leave too few": (["search", "--model", "arith-gpt2", "--task", str(task), "--shots", "4",
                                 "--n-prompts", "3"],
                                "tiny_add.toml' less the 4 solved examples of --shots; give at most 2"),
        "sweep grid": (["sweep", "--config", sweep_config(tmp_path, "grid", grid='"nonsense"')],
                       "sweep key grid='nonsense' is not valid"),
        "sweep frozen count": (["sweep", "--config",
                                sweep_config(tmp_path, "frozen", source='"frozen"', n_prompts="5000")],
                               "sweep key n_prompts 5000 exceeds the 300 prompts of task 'add''s frozen set"),
    }


CASES = ["frozen set smaller", "groundtruth absurd count", "groundtruth more than the task", "shots the whole task",
         "shots leave too few", "sweep grid", "sweep frozen count"]


@pytest.mark.parametrize("case", CASES)
def test_settings_a_task_cannot_honour_are_refused_before_loading(case, tmp_path, capsys, no_model):
    argv, said = cases(tmp_path)[case]
    out = tmp_path / "out"
    code = cli.main([*argv, "--out", str(out), "--no-progress"])
    one_line_error(capsys, code, said)
    assert not out.exists()
