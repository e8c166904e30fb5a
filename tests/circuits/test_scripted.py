"""Scripted use of ``af1``: ``--version``, ``--quiet``, ``--log-file``, "did you mean" for commands and tasks, and the
one rule by which every file option finds a shipped file (``circuits.tasks.package_data.find_file``)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version

import pytest

from circuits import __version__, cli
from circuits.errors import ArgumentError, did_you_mean
from circuits.sweep import SweepConfig
from circuits.tasks import catalogue as tasks
from circuits.tasks.package_data import datasets_dir, find_file
from tests.circuits.test_cli import tiny_loading  # noqa: F401 - the fixture

SEARCH = ["search", "--model", "tiny", "--task", "t", "--n-prompts", "20", "--grid", "full", "--threshold", "0.5"]


def test_version_names_the_package_and_its_stack(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    line = capsys.readouterr().out.strip()
    assert len(line.splitlines()) == 1 and line.startswith(f"af1 {__version__} ")
    assert f"torch {version('torch')}" in line and f"transformer-lens {version('transformer-lens')}" in line


@pytest.mark.parametrize(("argv", "guess"), [(["serach"], "'search'"), (["--debug", "necesity", "--out", "x"],
                                                                         "'necessity'"),
                                             (["--log-file", "l.log", "sweeps"], "'sweep'")])
def test_mistyped_command_is_one_line_with_the_close_ones(argv, guess, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"did you mean {guess}?" in err and "commands: demo, zoo" in err


def test_did_you_mean_is_empty_when_nothing_is_close():
    assert did_you_mean("zzzz", ["search", "sweep"]) == ""
    assert did_you_mean("add_sbu", ["add_sub", "mul"]) == "did you mean 'add_sub'? "


def test_mistyped_task_names_the_close_task(capsys):
    assert cli.main(["search", "--model", "arith-gpt2", "--task", "add_sbu", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "--task 'add_sbu' is unknown; did you mean 'add_sub'" in err
    with pytest.raises(ArgumentError, match="unknown task 'verbal_ad'; did you mean 'verbal_add'"):
        tasks.get_task("verbal_ad")
    assert cli.main(["sweep", "--models", "arith-gpt2", "--tasks", "add_sub,sub_ad", "--out", "x"]) == 2
    assert "task 'sub_ad' is unknown; did you mean 'sub_add'" in capsys.readouterr().err


def test_quiet_prints_nothing_and_the_log_file_keeps_everything(tiny_loading, tmp_path, capsys):  # noqa: F811
    out, log = tmp_path / "s", tmp_path / "run.log"
    assert cli.main([*SEARCH, "--out", str(out), "--quiet", "--log-file", str(log)]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""  # no progress bars either
    lines = log.read_text().splitlines()
    assert re.fullmatch(r"# af1 search --model tiny .* --quiet --log-file \S+ \(started \d{4}-\d\d-\d\dT[\d:]+Z\)",
                        lines[0])
    assert re.fullmatch(r"# exit 0 after \d+\.\d s", lines[-1])
    assert any("smallest transfer" in x for x in lines) and any("report.html" in x for x in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert "--quiet" not in summary["command"] and "--log-file" not in summary["command"]
    # appended: a second command (resumed) adds its own first and last lines; an error line lands there too
    assert cli.main(["--quiet", *SEARCH, "--n-prompts", "0", "--out", str(out), "--log-file", str(log)]) == 2
    err = capsys.readouterr().err
    text = log.read_text()
    assert text.count("(started ") == 2 and re.search(r"# exit 2 after \d+\.\d s\n$", text)
    assert err.strip() in text and err.startswith("af1 search: error: --n-prompts")


def test_not_quiet_shows_the_output_and_logs_it(tiny_loading, tmp_path, capsys):  # noqa: F811
    log = tmp_path / "run.log"
    assert cli.main([*SEARCH, "--out", str(tmp_path / "s"), "--log-file", str(log)]) == 0
    shown = capsys.readouterr().out
    assert "smallest transfer" in shown and shown.strip().splitlines()[-1] in log.read_text()


def test_unwritable_log_file_is_one_line(tmp_path, capsys):
    assert cli.main(["search", "--model", "arith-gpt2", "--task", "add_sub", "--out", str(tmp_path / "s"),
                     "--log-file", str(tmp_path / "no" / "such" / "x.log")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--log-file" in err and "No such file or directory" in err


def test_file_options_find_shipped_files_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the data folder (as --task examples/mul.toml always did) and the installed package (the README's sweep configs)
    assert find_file("examples/mul.toml") == datasets_dir() / "examples" / "mul.toml"
    config = find_file("circuits/sweep/examples/styles.toml")
    assert config.is_file() and config.parts[-4:] == ("circuits", "sweep", "examples", "styles.toml")
    # a file here wins over a shipped one; a missing file stays as given so the error names it
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "mul.toml").write_text("x")
    assert find_file("examples/mul.toml").resolve() == tmp_path / "examples" / "mul.toml"
    assert str(find_file("nope.toml")) == "nope.toml" and str(find_file("circuits/nope.toml")) == "circuits/nope.toml"
    from circuits.commands.sweep import read_config
    from circuits.sweep import SweepConfig

    args = cli.build_parser().parse_args(["sweep", "--config", "circuits/sweep/examples/styles.toml", "--out", "o"])
    assert read_config(args) == SweepConfig.from_toml(config) == SweepConfig.from_toml(
        "circuits/sweep/examples/styles.toml")
    from circuits.prompts.datasets import read_prompts

    rows = read_prompts("examples/capital.jsonl")
    assert len(rows) == len((datasets_dir() / "examples" / "capital.jsonl").read_text().splitlines())


def test_zoo_list_columns_are_aligned(tmp_path, capsys):
    from circuits import zoo

    assert cli.main(["zoo", "list", "--quiet", "--log-file", str(tmp_path / "zoo.log")]) == 0  # flags of an action too
    assert capsys.readouterr().out == "" and "arith-gpt2" in (tmp_path / "zoo.log").read_text()
    assert cli.main(["zoo", "list"]) == 0
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    header, rows = lines[0], lines[1:]
    assert header.split()[:4] == ["model", "arch", "tasks", "min"] and len(rows) == len(zoo.available())
    for name, row in zip(zoo.available(), rows):
        card = zoo.card(name)
        assert row.startswith(name + " ") and row.index(" " + card["arch"] + " ") + 1 == header.index("arch")
        assert row.index(card["description"]) == header.index("description")  # every column starts at its header
        worst = min(card["frozen_accuracy"][t] for t in card["train"]["tasks"])
        assert row[: header.index("description")].rstrip().endswith(f"{worst:.3f}")


def test_one_cell_fixed_sweep_shows_its_interval():
    from circuits.sweep.run import CellResult
    from circuits.sweep.table import heatmap, markdown

    config = SweepConfig.from_mapping({"models": ["m"], "tasks": ["add"], "mode": "fixed", "wait": 3, "transfer": 1})
    row = CellResult("m", "add", "cama", 0, base_accuracy=1.0, n_prompts=20, wait=3, transfer=1, faithfulness=0.85,
                     ci_low=0.7, ci_high=0.95)
    fig = heatmap(config, "m", [row])
    assert [list(r) for r in fig.data[0].text] == [["0.85<br>[0.70, 0.95]"]] and "95% interval" in fig.layout.title.text
    assert "| 0.850 / 0.850 / 0.850 | [0.700, 0.950] |" in markdown(config, [row])
    # seeds: the bounds averaged, as table.md does
    config = SweepConfig.from_mapping({"models": ["m"], "tasks": ["add"], "mode": "fixed", "wait": 3, "transfer": 1,
                                       "seeds": [0, 1]})
    other = CellResult("m", "add", "cama", 1, faithfulness=0.75, ci_low=0.6, ci_high=0.85, wait=3, transfer=1,
                       base_accuracy=1.0)
    assert [list(r) for r in heatmap(config, "m", [row, other]).data[0].text] == [["0.80<br>[0.65, 0.90]"]]


def test_notebooks_command_copies_the_shipped_notebooks(tmp_path, capsys):
    from circuits.tasks.package_data import notebooks_dir

    shipped = sorted(notebooks_dir().glob("*.ipynb"))
    assert len(shipped) >= 6 and notebooks_dir().name == "notebooks"
    out = tmp_path / "nbs"
    assert cli.main(["notebooks", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in shipped]
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in shipped)
    assert f"{len(shipped)} notebooks in {out}" in capsys.readouterr().out
    # a notebook already there is kept, unless --force
    (out / shipped[0].name).write_text("my edits")
    assert cli.main(["notebooks", str(out)]) == 2
    assert f"already holds {shipped[0].name}" in capsys.readouterr().err
    assert (out / shipped[0].name).read_text() == "my edits"
    assert cli.main(["notebooks", str(out), "--force"]) == 0
    assert (out / shipped[0].name).read_bytes() == shipped[0].read_bytes()
