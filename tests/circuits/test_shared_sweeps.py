"""Two sweeps sharing cells: a second sweep whose cells overlap the first's, into the same ``--out``, is refused in
one line naming what differs and changes nothing; two identical sweeps started at once end with every cell's
results written once, as one sweep alone writes them (docs/reliability.md, "Models, run directories and
signals")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from circuits import cli
from circuits.store import files
from tests.circuits.test_reliability2 import one_line_error, snapshot

ROOT = Path(__file__).resolve().parents[2]
BASE = ["sweep", "--models", "arith-gpt2", "--ablations", "zero", "--n-prompts", "8", "--no-progress"]


def records(out: Path) -> dict[str, list[tuple[int, int, float]]]:
    """Per cell, its configurations and faithfulness, in file order (a configuration written twice shows)."""
    found = {}
    for path in sorted(out.rglob(files.SEARCH_RESULTS)):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        found[str(path.relative_to(out))] = [(r["wait"], r["transfer"], r["faithfulness"]) for r in rows]
    return found


def test_a_sweep_over_cells_of_another_sweep_in_its_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert cli.main([*BASE, "--tasks", "add", "--out", str(out)]) == 0
    capsys.readouterr()
    before = snapshot(out)
    code = cli.main([*BASE, "--tasks", "add,sub", "--out", str(out)])  # shares the cell arith-gpt2/add/zero
    one_line_error(capsys, code, "tasks")
    assert snapshot(out) == before


def test_two_identical_sweeps_started_at_once_write_each_cell_once(tmp_path):
    out, alone = tmp_path / "sweep", tmp_path / "alone"
    argv = [*BASE, "--tasks", "add,sub", "--out"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "circuits.cli", *argv, str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ended = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in ended)
    assert codes in ([0, 0], [0, 2]), ended
    if codes == [0, 2]:  # the usual case: the second found the directory locked
        refused = next(err for code, err in ended if code == 2).strip().splitlines()
        assert len(refused) == 1 and "is in use by another af1 command" in refused[0], refused
    assert not (out / files.LOCK).exists()
    assert cli.main([*argv, str(alone)]) == 0
    assert records(out) == records(alone) and len(records(out)) == 2
