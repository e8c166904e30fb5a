"""A killed ``af1 edges`` run resumes when the same command is run again into the same ``--out``: the batches
scored before are not scored again, the circuits of the curve evaluated before are not evaluated again, and the
outputs are those of an uninterrupted run, bit for bit. A checkpoint of another run is refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from circuits import cli
from circuits.edges import circuit, resume
from circuits.edges import scores as sc
from circuits.edges.graph import Layout, zeros
from circuits.errors import CorruptRunError
from circuits.store import checkpoints
from tests.circuits.test_cli import tiny_loading  # noqa: F401  (the fixture)

ARGV = ["edges", "--model", "tiny", "--task", "t", "--n-prompts", "12", "--counterfactual", "cama", "--steps", "3",
        "--batch-size", "4", "--no-progress"]
"""Three batches of four prompts."""


class Calls:
    """Counts the calls of a module function; raises ``KeyboardInterrupt`` at call ``stop`` (1-based)."""

    def __init__(self, monkeypatch, module, name, stop=None):
        self.n, self.stop, self.real = 0, stop, getattr(module, name)
        monkeypatch.setattr(module, name, self)

    def __call__(self, *args, **kwargs):
        self.n += 1
        if self.n == self.stop:
            raise KeyboardInterrupt
        return self.real(*args, **kwargs)


def arrays(out):
    with np.load(out / "edges.npz") as npz:
        return {k: npz[k] for k in npz.files}


def curve(out):
    return json.loads((out / "edges.json").read_text())["curve"]


def same(a, b):
    assert arrays(a).keys() == arrays(b).keys()
    for k, v in arrays(a).items():
        assert v.dtype == arrays(b)[k].dtype and v.tobytes() == arrays(b)[k].tobytes(), k
    assert curve(a) == curve(b)


@pytest.fixture
def whole(tiny_loading, tmp_path):  # noqa: F811
    """An uninterrupted run."""
    out = tmp_path / "whole"
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    return out


def test_a_run_killed_after_the_first_batch_resumes_it(whole, tmp_path, monkeypatch):
    out = tmp_path / "killed"
    calls = Calls(monkeypatch, sc, "one_batch", stop=2)
    assert cli.main([*ARGV, "--out", str(out)]) == 2  # interrupted at the second batch
    assert (out / resume.SUMS).is_file() and not (out / "edges.npz").exists()
    calls.n, calls.stop = 0, None
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    assert calls.n == 2  # batches 2 and 3: the first was not scored again
    same(out, whole)


def test_a_run_killed_in_the_curve_keeps_its_scores_and_circuits(whole, tmp_path, monkeypatch):
    out = tmp_path / "killed"
    metrics = Calls(monkeypatch, circuit, "circuit_metrics", stop=4)
    assert cli.main([*ARGV, "--out", str(out)]) == 2  # the empty circuit and two sizes evaluated
    assert len((out / resume.CURVE).read_text().splitlines()) == 3
    batches = Calls(monkeypatch, sc, "one_batch")
    metrics.n, metrics.stop = 0, None
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    assert batches.n == 0 and metrics.n == 8  # 11 circuits, 3 done before
    same(out, whole)


def test_the_same_command_again_recomputes_nothing(whole, monkeypatch):
    before = arrays(whole)
    batches = Calls(monkeypatch, sc, "one_batch")
    metrics = Calls(monkeypatch, circuit, "circuit_metrics")
    assert cli.main([*ARGV, "--out", str(whole)]) == 0
    assert batches.n == 0 and metrics.n == 0
    assert all(before[k].tobytes() == v.tobytes() for k, v in arrays(whole).items())


def test_a_smaller_batch_goes_on_from_the_prompts_done(whole, tmp_path, monkeypatch):
    """As ``--batch-size auto`` halving after an out-of-memory error: the same scores up to float32 rounding."""
    out = tmp_path / "killed"
    calls = Calls(monkeypatch, sc, "one_batch", stop=2)
    assert cli.main([*ARGV, "--out", str(out)]) == 2
    calls.n, calls.stop = 0, None
    assert cli.main([*[a if a != "4" else "2" for a in ARGV], "--out", str(out)]) == 0
    assert calls.n == 4  # prompts 4..11 in batches of 2
    np.testing.assert_allclose(arrays(out)["score"], arrays(whole)["score"], rtol=1e-4, atol=1e-6)


def test_a_checkpoint_of_another_run_is_refused(whole, tmp_path, monkeypatch, capsys):
    out = tmp_path / "other"
    argv = [*[a if a != "3" else "2" for a in ARGV], "--out", str(out)]  # --steps 2: another run
    calls = Calls(monkeypatch, sc, "one_batch", stop=2)
    assert cli.main(argv) == 2
    shutil.copy(whole / resume.SUMS, out / resume.SUMS)
    calls.stop = None
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "written by another run" in err and resume.SUMS in err and "Traceback" not in err


def test_partial_round_trip_and_checks():
    layout = Layout(n_layers=2, n_heads=2, n_kv_heads=1, d_model=4, n_pos=3)
    sums = {slot: torch.randn(t.shape) for slot, t in zeros(layout).items()}
    part = resume.Partial(done=4, sums=sums, clean=torch.randn(4), batch_size=2)
    back = resume.Partial.from_bytes(part.to_bytes(), layout, 8)
    assert back.done == 4 and back.batch_size == 2 and torch.equal(back.clean, part.clean)
    assert all(torch.equal(back.sums[s], sums[s]) for s in sums)
    with pytest.raises(CorruptRunError, match="do not fit the run"):
        resume.Partial.from_bytes(part.to_bytes(), layout, 3)
    with pytest.raises(CorruptRunError, match="graph"):
        resume.Partial.from_bytes(part.to_bytes(), Layout(2, 2, 2, 4, 3), 8)
    with pytest.raises(CorruptRunError, match="not a checkpoint"):
        resume.Partial.from_bytes(b"garbage", layout, 8)


def test_checkpoint_files_carry_their_run(tmp_path):
    path = tmp_path / "x.ckpt"
    assert checkpoints.read_checkpoint(path, "a" * 64) is None
    checkpoints.write_checkpoint(path, "a" * 64, b"payload\nmore")
    assert checkpoints.read_checkpoint(path, "a" * 64) == b"payload\nmore"
    with pytest.raises(CorruptRunError, match="another run"):
        checkpoints.read_checkpoint(path, "b" * 64)
    path.write_bytes(b"something else")
    with pytest.raises(CorruptRunError, match="not an af1 checkpoint"):
        checkpoints.read_checkpoint(path, "a" * 64)


def test_keeper_writes_after_the_first_and_last_batch_and_at_most_a_tenth_of_the_time():
    kept, now = [], [0.0]
    part = resume.Partial(done=1, sums={}, clean=torch.zeros(1), batch_size=1)

    def keep(data):
        kept.append(part.done)
        now[0] += 1.0  # each write takes 1 s

    keeper = resume.Keeper(keep, total=10, clock=lambda: now[0])
    for done in range(1, 11):
        part.done, part.clean = done, torch.zeros(done)
        keeper(part)
        now[0] += 2.0  # each batch takes 2 s
    assert kept == [1, 6, 10]  # the first batch, once 5 batches took 10 s >= 9 x 1 s, the last
