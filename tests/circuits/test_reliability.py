"""Run directories that never mix, lock, or lie; every bad input a one-line error (docs/reliability.md).

The table tests run each bad input through the command line (``cli.main``) or the Python API and assert
what the user sees: exit code 2, exactly one line on stderr, no traceback, and nothing written or changed
in ``--out``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import interventions as iv
from circuits import cli
from circuits.errors import ArgumentError, CorruptRunError, RunLockedError, RunMismatchError
from circuits.faithfulness import faithfulness
from circuits.necessity import necessity_sweep
from circuits.prompts.fitset import FitSet
from circuits.prompts.sampling import self_answer_prompts
from circuits.prune import prune_heads
from circuits.search import SearchConfig, search_af1
from circuits.store import files
from circuits.store.lock import DirLock
from tests.conftest import build_default, disjoint_fit_tokens, random_tokens

ROOT = Path(__file__).resolve().parents[2]
ZOO = ["--model", "arith-gpt2", "--task", "add_sub", "--no-progress"]


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` with its bytes (``None`` if ``path`` does not exist)."""
    if not path.exists():
        return None
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- setups: each returns the --out to use (and may fill it) ------------------------------------------
def fresh(tmp: Path) -> Path:
    return tmp / "out"


def a_file(tmp: Path) -> Path:
    return write(tmp / "out", "not a directory")


def under_a_file(tmp: Path) -> Path:
    write(tmp / "file", "x")
    return tmp / "file" / "out"


def with_identity(identity: object):
    def setup(tmp: Path) -> Path:
        write(tmp / "out" / files.IDENTITY, identity if isinstance(identity, str) else json.dumps(identity))
        return tmp / "out"
    return setup


def orphan_results(tmp: Path) -> Path:
    write(tmp / "out" / files.SEARCH_RESULTS, '{"wait": 0}\n')
    return tmp / "out"


def orphan_report(tmp: Path) -> Path:
    write(tmp / "out" / files.REPORT, "<html></html>")
    return tmp / "out"


NECESSITY_ID = {"analysis": "necessity", "model": "arith-gpt2"}
LENS_ID = {"analysis": "lens", "model": "arith-gpt2"}
SEARCH_ID = {"model": "arith-gpt2", "threshold": 0.9}
PRUNE_ID = {"command": "prune", "wait": 1}
DEEP = "[" * 100_000 + "]" * 100_000

CLI_CASES = [
    # (id, argv after the command name, setup, substring of the message)
    ("threshold>1", ["search", *ZOO, "--threshold", "2"], fresh, "--threshold 2.0 is out of range"),
    ("threshold<0", ["search", *ZOO, "--threshold", "-0.1"], fresh, "--threshold -0.1 is out of range"),
    ("threshold nan", ["search", *ZOO, "--threshold", "nan"], fresh, "--threshold nan is out of range"),
    ("n-prompts 0", ["search", *ZOO, "--n-prompts", "0"], fresh, "--n-prompts 0 is out of range"),
    ("n-prompts <0", ["search", *ZOO, "--n-prompts", "-3"], fresh, "--n-prompts -3 is out of range"),
    ("n-prompts huge", ["search", *ZOO, "--n-prompts", "10000000"], fresh, "--n-prompts 10000000 is out of range"),
    ("n-prompts > task", ["search", "--model", "arith-gpt2", "--task", "add_small", "--n-prompts", "90000"],
     fresh, "exceeds the"),
    ("batch-size 0", ["search", *ZOO, "--batch-size", "0"], fresh, "--batch-size 0 is out of range"),
    ("necessity batch 0", ["necessity", *ZOO, "--batch-size", "0"], fresh, "--batch-size 0 is out of range"),
    ("device nonsense", ["search", *ZOO, "--device", "nonsense"], fresh, "--device 'nonsense' is not a torch device"),
    ("device cuda", ["search", *ZOO, "--device", "cuda:7"], fresh, "--device cuda:7"),
    ("unknown task", ["search", "--model", "arith-gpt2", "--task", "nope"], fresh, "--task 'nope' is unknown"),
    ("necessity task", ["necessity", "--model", "arith-gpt2", "--task", "nope"], fresh, "--task 'nope' is unknown"),
    ("prune transfer 0", ["prune", *ZOO, "--wait", "1", "--transfer", "0"], fresh, "needs transfer heads"),
    ("prune wait -2", ["prune", *ZOO, "--wait", "-2", "--transfer", "1"], fresh, "--wait -2 is out of range"),
    ("prune target", ["prune", *ZOO, "--wait", "1", "--transfer", "1", "--target", "1.5"], fresh,
     "--target 1.5 is out of range"),
    ("prune confirm 0", ["prune", *ZOO, "--wait", "1", "--transfer", "1", "--confirm-top", "0"], fresh,
     "--confirm-top 0 must be an integer >= 1"),
    ("prune confirm+none", ["prune", *ZOO, "--wait", "1", "--transfer", "1", "--confirm-top", "2", "--rank", "none"],
     fresh, "--confirm-top 2 needs --rank attribution"),
    ("prune device", ["prune", *ZOO, "--wait", "1", "--transfer", "1", "--device", "tpu"], fresh, "--device"),
    ("lens top-k 0", ["lens", "--model", "arith-gpt2", "--task", "add", "--top-k", "0"], fresh, "--top-k 0"),
    ("lens n-prompts 0", ["lens", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "0"], fresh,
     "--n-prompts 0"),
    ("lens batch 0", ["lens", "--model", "arith-gpt2", "--task", "add", "--batch-size", "0"], fresh, "--batch-size 0"),
    ("lens device", ["lens", "--model", "arith-gpt2", "--task", "add", "--device", "nonsense"], fresh, "--device"),
    ("lens task", ["lens", "--model", "arith-gpt2", "--task", "nope"], fresh, "--task 'nope' is unknown"),
    ("out is a file", ["search", *ZOO], a_file, "is not a directory"),
    ("out under a file", ["search", *ZOO], under_a_file, "is not a directory"),
    ("lens out is a file", ["lens", "--model", "arith-gpt2", "--task", "add"], a_file, "is not a directory"),
    ("search into necessity dir", ["search", *ZOO], with_identity(NECESSITY_ID), "different command (`af1 necessity`"),
    ("search into lens dir", ["search", *ZOO], with_identity(LENS_ID), "different command (`af1 lens`"),
    ("lens into search dir", ["lens", "--model", "arith-gpt2", "--task", "add"], with_identity(SEARCH_ID),
     "different command (`af1 search`"),
    ("necessity into prune dir", ["necessity", *ZOO], with_identity(PRUNE_ID), "different command (`af1 prune`"),
    ("prune into search dir", ["prune", *ZOO, "--wait", "1", "--transfer", "1"], with_identity(SEARCH_ID),
     "different command (`af1 search`"),
    ("run.json []", ["search", *ZOO], with_identity("[]"), "not an object"),
    ("run.json number", ["search", *ZOO], with_identity("3"), "not an object"),
    ("run.json invalid", ["search", *ZOO], with_identity("{not json"), "is not valid JSON"),
    ("run.json deep", ["search", *ZOO], with_identity(DEEP), "is not valid JSON"),
    ("results without run.json", ["search", *ZOO], orphan_results, "cannot tell which command"),
    ("report without run.json", ["lens", "--model", "arith-gpt2", "--task", "add"], orphan_report,
     "cannot tell which command"),
    ("unknown model", ["search", "--model", "no-such-model-xyz", "--task", "add_sub", "--no-progress"], fresh,
     "cannot load model 'no-such-model-xyz'"),
    ("zoo eval unknown", ["zoo", "eval", "no-such-model"], None, "unknown zoo model"),
    ("zoo train unknown", ["zoo", "train", "no-such-model"], None, "unknown zoo model"),
    ("device cuda, no GPU", ["search", *ZOO, "--device", "cuda"], fresh, "no CUDA GPU is available"),
    ("out not creatable", ["search", *ZOO], lambda tmp: Path("/proc/af1-no-such-dir"), "/proc/af1-no-such-dir"),
    ("max-checked 0", ["search", *ZOO, "--max-checked", "0"], fresh, "--max-checked 0 is out of range"),
    ("prune wait too late", ["prune", *ZOO, "--n-prompts", "5", "--wait", "5", "--transfer", "1"], fresh,
     "--wait 5 is out of range: valid -1..4"),
    ("sweep unknown task", ["sweep", "--models", "arith-gpt2", "--tasks", "nope"], fresh, "task 'nope' is unknown"),
    ("sweep seeds", ["sweep", "--models", "arith-gpt2", "--tasks", "add", "--seeds", "a,b"], fresh,
     "give comma-separated integers"),
    ("sweep no config", ["sweep", "--config", "/no/such.toml"], fresh, "--config /no/such.toml: no such file"),
    ("sweep fixed half", ["sweep", "--models", "arith-gpt2", "--tasks", "add", "--wait", "1"], fresh,
     "needs wait and transfer"),
    ("sweep into search dir", ["sweep", "--models", "arith-gpt2", "--tasks", "add"], with_identity(SEARCH_ID),
     "different command (`af1 search`"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line_input_is_one_line(case, tmp_path, capsys):
    _, argv, setup, expected = case
    argv = list(argv)
    out = None
    if setup is not None:
        out = setup(tmp_path)
        argv += ["--out", str(out)]
    before = snapshot(out) if out is not None else None
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"af1 {argv[0]}: error: ") and expected in lines[0], lines[0]
    assert len(lines[0]) <= 600
    if out is not None:
        assert snapshot(out) == before, "the failed command changed --out"


def test_debug_prints_the_traceback(tmp_path, capsys):
    assert cli.main(["--debug", "search", *ZOO, "--threshold", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("af1 search: error: --threshold")


def test_unexpected_errors_are_one_line_with_exit_1(tmp_path, capsys, monkeypatch):
    from circuits.commands import search

    def boom(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(search, "run", boom)
    assert cli.main(["search", *ZOO, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["af1 search: internal error: ZeroDivisionError: division by zero (run with --debug for the traceback)"]


def test_only_the_projects_errors_are_user_errors():
    """``describe`` maps the project's errors (and OS errors, out of memory, Ctrl-C) to exit code 2; a bare
    ``ValueError``, ``TypeError`` or ``KeyError`` is a bug (``None``: exit code 1)."""
    from circuits.errors import ArgumentError, ModelLoadError, PromptError
    from interventions.errors import InterventionError, InterventionNotAppliedError

    for err in (ArgumentError("--x 3 is out of range"), PromptError("too few"), ModelLoadError("no such model"),
                InterventionError("layer=9"), InterventionNotAppliedError("hook never fired"),
                FileNotFoundError(2, "No such file or directory", "a.json"), KeyboardInterrupt(),
                json.JSONDecodeError("Expecting value", "x", 0)):
        assert cli.describe(err)[1] == 2, err
    assert cli.describe(ArgumentError("--x 3 is out of range")) == ("--x 3 is out of range", 2)
    for bug in (ValueError("bug"), TypeError("bug"), KeyError("bug"), IndexError("bug"), AttributeError("bug"),
                UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")):
        assert cli.describe(bug) is None, bug


@pytest.mark.parametrize("raised, code, line", [
    (ValueError("bug"), 1, "af1 search: internal error: ValueError: bug (run with --debug for the traceback)"),
    (ArgumentError("--x 3 is out of range"), 2, "af1 search: error: --x 3 is out of range"),
])
def test_a_bare_value_error_is_a_bug_and_a_project_error_is_the_users(tmp_path, capsys, monkeypatch, raised, code,
                                                                      line):
    from circuits.commands import search

    def fail(args):
        raise raised

    monkeypatch.setattr(search, "run", fail)
    assert cli.main(["search", *ZOO, "--out", str(tmp_path / "o")]) == code
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert cli.main(["--debug", "search", *ZOO, "--out", str(tmp_path / "o")]) == code
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1] == line


# --- the Python API ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    model = build_default("gpt2")
    tokens = random_tokens(40, 6, seed=4, values=5)
    prompts = self_answer_prompts(model, tokens, task="random")
    return model, replace(prompts, fit=FitSet.given(disjoint_fit_tokens(tokens)))


API_CASES = [
    ("n_boot 0", lambda m, p: search_af1(m, p.tokens, p.answers, n_boot=0, progress=False), "n_boot=0"),
    ("n_boot -5", lambda m, p: search_af1(m, p.tokens, p.answers, n_boot=-5, progress=False), "n_boot=-5"),
    ("search batch 0", lambda m, p: search_af1(m, p.tokens, p.answers, batch_size=0, progress=False), "batch_size=0"),
    ("threshold bool", lambda m, p: SearchConfig(threshold=True).validate(), "threshold=True"),
    ("necessity batch 0", lambda m, p: necessity_sweep(m, p.tokens, p.answers, batch_size=0, progress=False),
     "batch_size=0"),
    ("necessity n_boot 0", lambda m, p: necessity_sweep(m, p.tokens, p.answers, n_boot=0, progress=False), "n_boot=0"),
    ("prune n_boot 0", lambda m, p: prune_heads(m, p.tokens, p.answers, wait=1, transfer=1, ablation="zero",
                                                n_boot=0, progress=False), "n_boot=0"),
    ("faithfulness batch 0", lambda m, p: faithfulness(m, p.tokens, p.answers, [], batch_size=0), "batch_size=0"),
    ("faithfulness n_boot 0", lambda m, p: faithfulness(m, p.tokens, p.answers, [], n_boot=0), "n_boot=0"),
    ("answer out of vocab", lambda m, p: search_af1(m, p.tokens, p.answers + 10_000, progress=False),
     "answer token id"),
    ("answers shape", lambda m, p: search_af1(m, p.tokens, p.answers[:3], progress=False), "one token id per prompt"),
    ("answers float", lambda m, p: search_af1(m, p.tokens, p.answers.float(), progress=False), "integer token ids"),
    ("float tokens", lambda m, p: search_af1(m, p.tokens.float(), p.answers, progress=False), "integer token ids"),
    ("fit batch 0", lambda m, p: iv.MeanCache.fit(m, p.tokens, batch_size=0), "batch_size=0"),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_input_raises_a_value_error_naming_it(case, tiny):
    _, call, expected = case
    with pytest.raises(ValueError) as err:
        call(*tiny)
    assert expected in str(err.value)


@pytest.fixture(scope="module")
def zoo_model():
    from circuits import zoo

    return zoo.load("arith-gpt2")


def test_missing_bos_is_named(zoo_model):
    tokens = zoo_model.to_tokens(["12+3-4="] * 4)
    answers = torch.full((4,), int(zoo_model.to_single_token("11")))
    with pytest.raises(ValueError, match=r"does not start with the BOS token \(id 0\).*prepend BOS"):
        search_af1(zoo_model, tokens[:, 1:], answers, progress=False)


def test_padded_batches_are_refused(zoo_model):
    tokens = zoo_model.to_tokens(["12+3-4=", "12+3="], padding_side="right")
    pad = zoo_model.tokenizer.pad_token_id
    assert int(tokens[1, -1]) == pad  # the shorter prompt is padded
    with pytest.raises(ValueError, match=r"pad token.*group prompts by token length \(circuits.tasks.to_layouts\)"):
        iv.MeanCache.fit(zoo_model, tokens)
    answers = torch.tensor([zoo_model.to_single_token("11")] * 2)
    with pytest.raises(ValueError, match="pad token"):
        search_af1(zoo_model, tokens, answers, progress=False)


# --- resumed records are validated --------------------------------------------------------------------
@pytest.fixture
def finished_search(tiny, tmp_path):
    model, p = tiny
    out = tmp_path / "run"
    search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, grid="full", progress=False, n_boot=50)
    return out


def rewrite_record(out: Path, index: int, **change) -> None:
    path = out / files.SEARCH_RESULTS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[index].update(change)
    for key in [k for k, v in change.items() if v is ...]:
        del rows[index][key]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("change,expected", [
    ({"wait": -5}, r"line 3: field 'wait' = -5 is outside -1\.\.3"),
    ({"n": 3}, r"line 3: field 'n' = 3 is outside"),
    ({"faithfulness": 1.5}, r"line 3: field 'faithfulness' = 1\.5 is outside 0\.\.1"),
    ({"faithfulness": ...}, r"line 3: field 'faithfulness' is missing"),
    ({"transfer": "2"}, r"line 3: field 'transfer' must be an integer"),
    ({"ablation": "zero"}, r"line 3: field 'ablation' = 'zero' is not one of 'cama'"),
    ({"wait": 3, "transfer": 0}, r"repeats line 1"),
])
def test_bad_resumed_records_are_refused(finished_search, tiny, change, expected):
    model, p = tiny
    rewrite_record(finished_search, 2, **change)
    with pytest.raises(CorruptRunError, match=expected):
        search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=finished_search, grid="full", progress=False, n_boot=50)


def test_a_non_object_record_is_refused(finished_search, tiny):
    model, p = tiny
    n_lines = len((finished_search / files.SEARCH_RESULTS).read_text().splitlines())
    with open(finished_search / files.SEARCH_RESULTS, "a") as f:
        f.write("[]\n")
    with pytest.raises(CorruptRunError, match=rf"line {n_lines + 1}: expected a JSON object"):
        search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=finished_search, grid="full", progress=False, n_boot=50)


def test_swapped_means_cache_is_refused(tiny, tmp_path):
    """Issue case: a cache fitted on other prompts copied into an interrupted run."""
    model, p = tiny
    small, big = tmp_path / "small", tmp_path / "big"
    search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=small, grid="full", progress=False, n_boot=50)
    search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=big, grid="full", progress=False, n_boot=50)
    lines = (small / files.SEARCH_RESULTS).read_text().splitlines(keepends=True)
    (small / files.SEARCH_RESULTS).write_text("".join(lines[:10]))  # interrupted after 10 configurations
    shutil.copy(big / files.MEANS, small / files.MEANS)
    before = snapshot(small)
    with pytest.raises(CorruptRunError, match="changed since this run wrote it"):
        search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=small, grid="full", progress=False, n_boot=50)
    assert snapshot(small) == before


def test_a_means_file_without_a_recorded_hash_is_refused(tiny, tmp_path):
    model, p = tiny
    out = tmp_path / "old"
    search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=out, grid="full", progress=False, n_boot=50)
    (out / files.ARTIFACTS).unlink()  # which cache this is can no longer be told
    before = snapshot(out)
    with pytest.raises(CorruptRunError, match="was not written by this run"):
        search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=out, grid="full", progress=False, n_boot=50)
    assert snapshot(out) == before


def test_foreign_means_with_their_own_artifacts_are_refused(tiny, tmp_path):
    """Another run's means copied in together with that run's artifacts.json (hashes that match): the cache
    was fitted on another fit set (the other run removed other scored prompts from it), so it is refused."""
    model, p = tiny
    small, big = tmp_path / "small", tmp_path / "big"
    search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=small, grid="full", progress=False, n_boot=50)
    other = FitSet.given(disjoint_fit_tokens(p.tokens, seed=7))
    search_af1(model, p.tokens[:20], p.answers[:20], fit=other, out_dir=big, grid="full", progress=False, n_boot=50)
    lines = (small / files.SEARCH_RESULTS).read_text().splitlines(keepends=True)
    (small / files.SEARCH_RESULTS).write_text("".join(lines[:10]))
    for name in (files.MEANS, files.ARTIFACTS):
        shutil.copy(big / name, small / name)
    with pytest.raises(CorruptRunError, match="written by another run|was not fitted on this run's fit set"):
        search_af1(model, p.tokens[:20], p.answers[:20], fit=p.fit, out_dir=small, grid="full", progress=False, n_boot=50)


def test_a_directory_of_means_fitted_on_the_scored_prompts_is_refused(tiny, tmp_path):
    """Run directories of earlier versions (means fitted on the prompts they scored) are never resumed."""
    model, p = tiny
    out = tmp_path / "old"
    search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, grid="full", progress=False, n_boot=50)
    ident = json.loads((out / files.IDENTITY).read_text())
    (out / files.IDENTITY).write_text(json.dumps({**ident, "means": "fitted on the prompts"}))
    before = snapshot(out)
    with pytest.raises(RunMismatchError, match="fitted the means on the scored prompts themselves.*new --out"):
        search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, grid="full", progress=False, n_boot=50)
    assert snapshot(out) == before


def test_truncated_means_cache_is_refused(finished_search, tiny):
    model, p = tiny
    data = (finished_search / files.MEANS).read_bytes()
    (finished_search / files.MEANS).write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptRunError, match="changed since this run wrote it"):
        search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=finished_search, grid="full", progress=False, n_boot=50)


# --- the lock -------------------------------------------------------------------------------------------
def test_a_locked_directory_is_refused_at_once_naming_the_holder(tiny, tmp_path):
    model, p = tiny
    out = tmp_path / "run"
    out.mkdir()
    with DirLock(out):
        t0 = time.perf_counter()
        with pytest.raises(RunLockedError, match=rf"in use by another af1 command \(process {os.getpid()}\)"):
            search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, progress=False)
        assert time.perf_counter() - t0 < 5
    assert not (out / files.LOCK).exists()
    search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, progress=False, n_boot=50)  # released: runs


def test_a_stale_lock_file_of_a_dead_process_is_ignored(tiny, tmp_path):
    model, p = tiny
    out = tmp_path / "run"
    write(out / files.LOCK, "999999\n")  # left by a process killed with -9: the kernel released its flock
    assert search_af1(model, p.tokens, p.answers, fit=p.fit, out_dir=out, progress=False, n_boot=50).n_evaluated > 0


def test_two_commands_on_one_directory(tmp_path):
    """Two identical commands into one --out: the second is refused while the first runs; no line twice."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "circuits.cli", "search", *ZOO, "--n-prompts", "60", "--grid", "full",
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / files.LOCK).exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    _, err1 = first.communicate(timeout=600)
    assert first.returncode == 0, err1
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"(process {first.pid})" in lines[0] and "Traceback" not in second.stderr
    rows = [json.loads(line) for line in (out / files.SEARCH_RESULTS).read_text().splitlines()]
    configs = [(r["wait"], r["transfer"]) for r in rows]
    assert len(configs) == len(set(configs)) == 28
