"""The ``af1 search`` / ``necessity`` / ``demo`` command lines, end to end through ``cli.main``."""

from __future__ import annotations

import json

import pytest

from circuits import cli
from circuits.commands import common
from circuits.errors import PromptError
from circuits.models import loading
from circuits.prompts import fitset, sampling
from circuits.prompts.fitset import FitSet
from circuits.prompts.sampling import self_answer_prompts
from tests.conftest import build_default, disjoint_fit_tokens, random_tokens


@pytest.fixture
def tiny_loading(monkeypatch):
    """Route --model/--task to a tiny random model whose answers are its own predictions."""
    model = build_default("gpt2")
    tokens = random_tokens(24, 6, seed=4, values=5)

    def load_model(name, device="cpu", backend=None, dtype=None, remote=False):
        assert name == "tiny" and backend in (None, "hooked", "bridge") and not remote
        return model

    def prepare_prompts(model_, task, n_prompts, seed=0, **kw):
        if n_prompts > 24:
            raise PromptError(f"too few correct prompts for task {task!r}: 24 available, {n_prompts} needed; "
                              f"lower --n-prompts to 24 or less")
        return self_answer_prompts(model_, tokens[:n_prompts], task=task)

    monkeypatch.setattr(loading, "load_model", load_model)
    monkeypatch.setattr(sampling, "prepare_prompts", prepare_prompts)
    fit = disjoint_fit_tokens(tokens)
    monkeypatch.setattr(fitset, "draw_fit_set", lambda model_, task, scored, spec, **kw: FitSet.given(fit, spec.min_count))
    monkeypatch.setattr(common, "check_task", lambda *args, **kwargs: None)  # task "t" is not in the catalogue
    return model


def test_commands_registered():
    assert {"demo", "search", "necessity"} <= set(cli.COMMANDS)
    help_text = cli.build_parser().format_help()
    assert "search" in help_text and "necessity" in help_text


def test_search_command(tiny_loading, tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["search", "--model", "tiny", "--task", "t", "--n-prompts", "20", "--grid", "full",
            "--threshold", "0.5", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "smallest transfer" in printed and "report.html" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny" and summary["task"] == "t" and summary["n_prompts"] == 20
    assert summary["command"][:2] == ["af1", "search"] and "--threshold" in summary["command"]
    assert len((out / "results.jsonl").read_text().splitlines()) == 15
    # same command again: everything resumed
    assert cli.main(argv) == 0
    assert "resumed 15 configuration(s)" in capsys.readouterr().out
    # another threshold into the same directory: the selection is recomputed, no configuration is
    other = [("0.7" if a == "0.5" else a) for a in argv]
    assert cli.main(other) == 0
    assert "resumed 15 configuration(s)" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert again["threshold"] == 0.7 and again["n_evaluated_this_run"] == 0 and again["n_resumed"] == 15


def test_search_command_too_few_prompts(tiny_loading, tmp_path, capsys):
    code = cli.main(["search", "--model", "tiny", "--task", "t", "--n-prompts", "50", "--out", str(tmp_path / "x")])
    assert code == 2
    assert "too few correct prompts" in capsys.readouterr().err


def test_necessity_command(tiny_loading, tmp_path, capsys):
    out = tmp_path / "n"
    assert cli.main(["necessity", "--model", "tiny", "--task", "t", "--n-prompts", "16", "--no-progress",
                     "--out", str(out)]) == 0
    assert len(json.loads((out / "necessity.json").read_text())["blocks"]) == 4
    assert (out / "report.html").exists()


def test_unknown_model_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="cannot load model 'no-such-model-xyz'"):
        loading.load_model("no-such-model-xyz")


def test_search_on_zoo_model(tmp_path, capsys):
    zoo = pytest.importorskip("circuits.zoo")
    tasks = pytest.importorskip("circuits.tasks")
    if not hasattr(tasks, "to_layouts") or zoo.DEFAULT_MODEL not in zoo.available():
        pytest.skip("zoo models or task layouts not available")
    out = tmp_path / "zoo"
    code = cli.main(["search", "--model", zoo.DEFAULT_MODEL, "--task", "add", "--n-prompts", "40",
                     "--no-progress", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_prompts"] == 40 and 0 < summary["base_accuracy"] <= 1
    prompts = [json.loads(x) for x in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 40 and all("+" in p["prompt"] for p in prompts)


def test_demo_command(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--n-prompts", "20", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "smallest transfer" in printed and "necessity" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_configs_evaluated"] == summary["n_configs_total"] == 28 and summary["n_prompts"] == 20
    assert (out / "report.html").exists() and (out / "necessity" / "report.html").exists()
    from circuits.groundtruth.recovery import planted_models, planted_structure

    planted = planted_models()
    if planted:  # a few lines: the search recovers a planted structure
        name = "arith-gpt2-gt-w2t2" if "arith-gpt2-gt-w2t2" in planted else planted[0]
        s = planted_structure(name)
        assert f"planted check: {name} was trained with wait={s.wait}, transfer={s.transfer}" in printed
        assert f"selected wait={s.wait}, transfer={s.transfer}" in printed and "  recovered;" in printed
    else:
        assert "planted check skipped" in printed


def test_backend_choices_are_the_backends():
    """``--backend`` lists interventions.BACKENDS (from the torch-free vocabulary: ``af1 --help`` imports no
    torch)."""
    import interventions as iv

    search = cli.build_parser()._subparsers._group_actions[0].choices["search"]
    backend = next(a for a in search._actions if a.dest == "backend")
    assert tuple(backend.choices) == iv.BACKENDS == ("hooked", "bridge", "nnsight")
