"""Run directories: crash-safe JSONL, torn-line repair, identity checks, atomic JSON."""

from __future__ import annotations

import json

import pytest

from circuits.store import runs


def test_append_and_read_back(tmp_path):
    path = tmp_path / "r.jsonl"
    for i in range(3):
        runs.append_line(path, {"i": i, "x": float(i) / 3, "t": (1, 2)})
    assert runs.read_jsonl(path) == [{"i": i, "t": [1, 2], "x": float(i) / 3} for i in range(3)]
    assert path.read_text().count("\n") == 3


def test_partial_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "r.jsonl"
    for i in range(4):
        runs.append_line(path, {"i": i})
    full = path.read_bytes()
    path.write_bytes(full + b'{"i": 4, "x')  # a write torn by kill -9
    assert runs.read_jsonl(path) == [{"i": i} for i in range(4)]
    assert path.read_bytes() == full + b'{"i": 4, "x'  # without repair the file is untouched
    assert runs.read_jsonl(path, repair=True) == [{"i": i} for i in range(4)]
    assert path.read_bytes() == full
    runs.append_line(path, {"i": 4})
    assert [r["i"] for r in runs.read_jsonl(path)] == [0, 1, 2, 3, 4]


def test_garbled_last_line_with_newline_is_dropped(tmp_path):
    path = tmp_path / "r.jsonl"
    runs.append_line(path, {"i": 0})
    with open(path, "ab") as f:
        f.write(b'{"i": 1\n')
    assert runs.read_jsonl(path, repair=True) == [{"i": 0}]
    assert path.read_text() == '{"i": 0}\n'


def test_corrupt_middle_line_raises(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"i": 0}\nnot json\n{"i": 2}\n')
    with pytest.raises(ValueError, match="corrupt: line 2"):
        runs.read_jsonl(path)


def test_non_finite_floats_become_null(tmp_path):
    path = tmp_path / "r.jsonl"
    runs.append_line(path, {"a": float("nan"), "b": float("inf"), "c": 0.5})
    assert runs.read_jsonl(path) == [{"a": None, "b": None, "c": 0.5}]


def test_run_dir_identity(tmp_path):
    ident = {"model": "m", "task": "add", "seed": 0, "threshold": 0.9}
    d = runs.RunDir(tmp_path / "out", ident).open()
    assert json.loads((tmp_path / "out" / "run.json").read_text()) == ident
    d.append({"wait": 1})
    # same identity: opens and resumes
    assert runs.RunDir(tmp_path / "out", dict(ident)).open().load_records() == [{"wait": 1}]
    with pytest.raises(runs.RunMismatchError) as err:
        runs.RunDir(tmp_path / "out", {**ident, "seed": 1, "task": "sub"}).open()
    msg = str(err.value)
    assert "seed: 0 -> 1" in msg and "task: 'add' -> 'sub'" in msg and "new --out" in msg
    assert isinstance(err.value, FileExistsError)


def test_results_without_identity_are_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text('{"wait": 0}\n')
    with pytest.raises(runs.RunMismatchError, match="cannot tell which command"):
        runs.RunDir(out, {"a": 1}).open()


def test_write_json_is_atomic_and_strict(tmp_path):
    path = runs.write_json(tmp_path / "s.json", {"x": (1, 2), "y": float("nan")})
    assert json.loads(path.read_text()) == {"x": [1, 2], "y": None}
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
