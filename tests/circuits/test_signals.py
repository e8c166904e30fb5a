"""Interrupting a command: Ctrl-C (SIGINT) and SIGTERM end it with the one "interrupted" line, exit code 2 and no
``.lock`` left behind; ``kill -9`` ends it at once. In every case the same command run again resumes and ends with
the results of a run that was never interrupted. The signal is sent by the process to itself at a chosen point of
the run (``tests/circuits/interrupt_driver.py``): while fitting the means, between the cells of a sweep, between
the points of a pruning curve and while the lens decodes (docs/reliability.md, "Models, run directories and
signals")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from circuits import cli
from circuits.store import files

ROOT = Path(__file__).resolve().parents[2]
ZOO = ["--model", "arith-gpt2", "--task", "add", "--n-prompts", "12", "--no-progress"]
COMMANDS = {
    "means": ["search", *ZOO],
    "sweep": ["sweep", "--models", "arith-gpt2", "--tasks", "add", "--ablations", "cama,zero", "--n-prompts", "12",
              "--no-progress"],
    "prune": ["prune", *ZOO, "--wait", "2", "--transfer", "2"],
    "lens": ["lens", *ZOO],
}
TIMINGS = {"seconds", "seconds_run", "wall_s", "passes_run", "n_resumed", "n_evaluated_this_run"}
"""Fields that say how long or how much this very run took, not what it found."""


def results_of(out: Path) -> dict[str, object]:
    """What a run found, file by file: every JSONL record (timings left out) and every array of a ``.npz``."""
    found: dict[str, object] = {}
    for path in sorted(out.rglob("*")):
        name = str(path.relative_to(out))
        if path.suffix == ".jsonl":
            found[name] = [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
                           for line in path.read_text().splitlines()]
        elif path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                found[name] = {k: z[k].tolist() for k in z.files}
    return found


_references: dict[str, dict[str, object]] = {}


def reference(phase: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The results of the phase's command run once without interruption (computed once per session)."""
    if phase not in _references:
        out = tmp_path_factory.mktemp(f"reference-{phase}") / "out"
        assert cli.main([*COMMANDS[phase], "--out", str(out)]) == 0
        _references[phase] = results_of(out)
    return _references[phase]


CASES = [("means", "SIGINT"), ("means", "SIGTERM"), ("means", "SIGKILL"), ("sweep", "SIGTERM"), ("sweep", "SIGKILL"),
         ("prune", "SIGTERM"), ("prune", "SIGKILL"), ("lens", "SIGTERM"), ("lens", "SIGKILL")]


@pytest.mark.parametrize("phase,signal_name", CASES)
def test_an_interrupted_command_says_so_releases_its_lock_and_resumes_to_the_same_results(
        phase, signal_name, tmp_path, tmp_path_factory):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.circuits.interrupt_driver", phase, signal_name, "--",
                           *COMMANDS[phase], "--out", str(out)], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)
    command = COMMANDS[phase][0]
    if signal_name == "SIGKILL":
        assert proc.returncode == -9, proc.stderr
    else:
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert lines == [f"af1 {command}: error: interrupted; finished results are saved: run the same command "
                         f"again to resume"], proc.stderr
        assert not (out / files.LOCK).exists()
    assert cli.main([*COMMANDS[phase], "--out", str(out)]) == 0  # resumed
    assert not (out / files.LOCK).exists()
    assert results_of(out) == reference(phase, tmp_path_factory)
