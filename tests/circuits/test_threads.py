"""``--threads`` and ``$AF1_THREADS``: torch's CPU threads for a command, checked before anything loads."""

from __future__ import annotations

import pytest
import torch

from circuits import cli
from circuits.errors import ArgumentError


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_flag_then_the_environment_then_torch_decides(monkeypatch, restore_threads):
    monkeypatch.delenv(cli.THREADS_ENV, raising=False)
    torch.set_num_threads(2)
    cli.set_threads(None)
    assert torch.get_num_threads() == 2  # neither given: torch's own setting stays
    monkeypatch.setenv(cli.THREADS_ENV, "1")
    cli.set_threads(None)
    assert torch.get_num_threads() == 1
    cli.set_threads(2)  # the flag wins over the environment
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("flag,env,said", [(0, None, "--threads 0 is out of range"),
                                           (None, "many", "$AF1_THREADS='many' is not an integer"),
                                           (None, "-1", "$AF1_THREADS -1 is out of range")])
def test_a_bad_value_is_one_line(flag, env, said, monkeypatch, restore_threads):
    monkeypatch.delenv(cli.THREADS_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(cli.THREADS_ENV, env)
    with pytest.raises(ArgumentError, match=said.replace("$", r"\$")):
        cli.set_threads(flag)


def test_the_commands_take_the_flag_and_refuse_a_bad_one_before_loading(tmp_path, capsys, monkeypatch,
                                                                        restore_threads):
    from circuits import zoo
    from circuits.models import loading

    def refuse(*_args, **_kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(zoo, "load", refuse)
    parser = cli.build_parser()
    for command in ("search", "necessity", "prune", "lens", "sweep"):
        extra = ["--wait", "1", "--transfer", "1"] if command == "prune" else []
        base = ["--models", "m", "--tasks", "add"] if command == "sweep" else ["--model", "m", "--task", "add"]
        assert parser.parse_args([command, *base, *extra, "--out", "o", "--threads", "3"]).threads == 3
    out = tmp_path / "o"
    assert cli.main(["search", "--model", "arith-gpt2", "--task", "add", "--threads", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "af1 search: error: --threads 0 is out of range: give an integer >= 1" and not out.exists()


@pytest.mark.parametrize("argv", [["search", "--model", "arith-gpt2", "--task", "add", "--threads", "100000"],
                                  ["zoo", "train", "arith-gpt2", "--threads", "100000"]])
def test_absurd_thread_counts_are_refused_in_one_line_before_loading(argv, tmp_path, capsys, monkeypatch,
                                                                     restore_threads):
    """``--threads 100000`` asked torch for 100,000 threads: a misleading out-of-memory error, then a crash; now
    the bound (4 per core) is said in one line before anything loads."""
    import os

    from circuits.validation import THREADS_PER_CORE, max_threads

    monkeypatch.delenv(cli.THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    out = tmp_path / "o"
    code = cli.main([*argv, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--threads 100000 is out of range: this machine has {os.cpu_count()} CPU cores; give at most " \
           f"{THREADS_PER_CORE * (os.cpu_count() or 1)}" in err
    assert not out.exists() and torch.get_num_threads() == before
    cli.set_threads(max_threads())  # the bound itself is accepted
    assert torch.get_num_threads() == max_threads()
    monkeypatch.setenv(cli.THREADS_ENV, str(max_threads() + 1))
    with pytest.raises(ArgumentError, match=r"\$AF1_THREADS \d+ is out of range: this machine has"):
        cli.set_threads(None)
