"""A killed ``af1 edges`` run resumes when the same command is run again into the same ``--out``: the fit set's means
are not computed again, the batches scored before are not scored again, the circuits of the curve evaluated before
are not evaluated again, and the outputs are those of an uninterrupted run, bit for bit. A checkpoint of another run,
or one changed since it was written, is refused."""

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
    means = Calls(monkeypatch, sc, "mean_outputs")
    assert cli.main([*ARGV, "--out", str(out)]) == 2  # interrupted at the second batch
    assert (out / resume.SUMS).is_file() and (out / resume.MEANS).is_file() and not (out / "edges.npz").exists()
    assert means.n == 1
    calls.n, calls.stop, means.n = 0, None, 0
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    assert calls.n == 2  # batches 2 and 3: the first was not scored again
    assert means.n == 0  # the means were read back, not computed again
    same(out, whole)


def test_a_run_killed_before_scoring_reads_its_means_back(whole, tmp_path, monkeypatch):
    """Killed at the first batch (no score sums kept yet): the resumed run computes no means and its ``edges.npz``
    is the uninterrupted run's, byte for byte."""
    out = tmp_path / "killed"
    calls = Calls(monkeypatch, sc, "one_batch", stop=1)
    means = Calls(monkeypatch, sc, "mean_outputs")
    assert cli.main([*ARGV, "--out", str(out)]) == 2
    assert (out / resume.MEANS).is_file() and not (out / resume.SUMS).exists() and means.n == 1
    calls.n, calls.stop, means.n = 0, None, 0
    assert cli.main([*ARGV, "--out", str(out)]) == 0
    assert calls.n == 3 and means.n == 0
    assert (out / "edges.npz").read_bytes() == (whole / "edges.npz").read_bytes()
    same(out, whole)


def killed_with_means(tmp_path, monkeypatch, argv=ARGV, name="killed"):
    """A run directory killed at its second batch (means and the first batch's sums kept); scoring is free again."""
    out = tmp_path / name
    calls = Calls(monkeypatch, sc, "one_batch", stop=2)
    assert cli.main([*argv, "--out", str(out)]) == 2
    calls.stop = None
    return out


@pytest.mark.parametrize("change, says", [
    (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "do not match their SHA-256"),  # one bit of the means
    (lambda data: data.partition(b"\n")[0] + b"\nnot safetensors", "not a means checkpoint"),  # the run's header kept
])
def test_a_changed_means_checkpoint_is_refused_in_one_line(tmp_path, monkeypatch, capsys, tiny_loading,  # noqa: F811
                                                           change, says):
    out = killed_with_means(tmp_path, monkeypatch)
    path = out / resume.MEANS
    path.write_bytes(change(path.read_bytes()))
    means = Calls(monkeypatch, sc, "mean_outputs")
    capsys.readouterr()
    assert cli.main([*ARGV, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if resume.MEANS in line]
    assert len(lines) == 1 and says in lines[0] and "move it away" in lines[0]
    assert "Traceback" not in err and means.n == 0 and not (out / "edges.npz").exists()


def test_a_means_checkpoint_of_another_run_is_refused(tmp_path, monkeypatch, capsys, tiny_loading):  # noqa: F811
    other = killed_with_means(tmp_path, monkeypatch, [*[a if a != "3" else "2" for a in ARGV]], "other")  # --steps 2
    out = killed_with_means(tmp_path, monkeypatch)
    shutil.copy(other / resume.MEANS, out / resume.MEANS)
    capsys.readouterr()
    assert cli.main([*ARGV, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "written by another run" in err and resume.MEANS in err and "Traceback" not in err


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
    means = Calls(monkeypatch, sc, "mean_outputs")
    assert cli.main([*ARGV, "--out", str(whole)]) == 0
    assert batches.n == 0 and metrics.n == 0 and means.n == 0
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


def test_means_round_trip_and_checks():
    layout = Layout(n_layers=2, n_heads=2, n_kv_heads=1, d_model=4, n_pos=3)
    s = layout.n_senders
    means = sc.MeanOutputs(mean=torch.randn(s, 3, 4), by_token={(0, 7): torch.randn(s, 4), (2, 5): torch.randn(s, 4)},
                           counts={(0, 7): 3, (2, 5): 1})
    back = sc.MeanOutputs.from_bytes(means.to_bytes(), layout)
    assert torch.equal(back.mean, means.mean) and back.counts == means.counts
    assert list(back.by_token) == list(means.by_token)
    assert all(torch.equal(back.by_token[k], v) for k, v in means.by_token.items())
    tokens = torch.tensor([[7, 1, 5]])
    assert torch.equal(back.lookup(tokens[:, [0]]), means.lookup(tokens[:, [0]]))
    with pytest.raises(CorruptRunError, match="do not fit the run's graph"):
        sc.MeanOutputs.from_bytes(means.to_bytes(), Layout(2, 2, 1, 4, 4))
    far = sc.MeanOutputs(mean=means.mean, by_token={(3, 7): torch.randn(s, 4)}, counts={(3, 7): 1})
    with pytest.raises(CorruptRunError, match="does not fit the run's 3 positions"):
        sc.MeanOutputs.from_bytes(far.to_bytes(), layout)
    with pytest.raises(CorruptRunError, match="not a means checkpoint"):
        sc.MeanOutputs.from_bytes(b"garbage", layout)
    with pytest.raises(CorruptRunError, match="not a means checkpoint"):  # a checkpoint of the sums
        sc.MeanOutputs.from_bytes(resume.Partial(1, zeros(layout), torch.zeros(1), 1).to_bytes(), layout)


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
