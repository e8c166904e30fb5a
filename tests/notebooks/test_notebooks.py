"""The notebooks under notebooks/ execute without error and are committed without outputs.

Each notebook runs in a fresh ``python3`` kernel (the kernel inherits this process's environment, so a
repository that is only on ``PYTHONPATH`` imports too) with ``notebooks/`` as working directory; a failing
cell raises ``nbclient.exceptions.CellExecutionError`` naming the cell source and the traceback.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = (
    "01_circuit_hunting.ipynb",
    "02_head_pruning.ipynb",
    "03_early_decoding.ipynb",
    "04_real_models.ipynb",
)
CELL_TIMEOUT_S = 300


def test_expected_notebooks_exist():
    found = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert found == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_has_no_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    for i, cell in enumerate(code):
        assert cell.get("outputs") == [], f"{name}: code cell {i} has committed outputs"
        assert cell.get("execution_count") is None, f"{name}: code cell {i} has an execution count"


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes(name, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # The kernel is a child process: make sure it finds the repository and this interpreter's packages.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), path) if p))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    start = time.perf_counter()
    client.execute()  # CellExecutionError (with the cell source and traceback) propagates
    print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "some code cells did not run"
