"""The built wheel installs into a clean virtual environment and works outside the source checkout.

Builds the wheel (``pip wheel --no-deps``) from a copy of the working tree, creates a fresh virtual
environment, installs the wheel with ``torch==2.13.0`` (the CPU build; the wheel's ``torch<2.14`` accepts
it) and lets pip resolve everything else, which gives the newest TransformerLens 4.x. Then, from a
folder outside the checkout and without ``PYTHONPATH``, it runs ``af1 zoo list``, a small ``af1 search``,
a small ``af1 lens`` and ``af1 demo``, and checks that the installed package reads its data from
site-packages.

Wall time with a warm pip cache, measured on 2 CPU cores shared with other work (load average 3-5):
52-84 s (wheel 2-5 s, venv 3-6 s, install 22-43 s, the four commands 18-25 s).
The first run downloads TransformerLens 4.x and its dependencies into pip's cache.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_PIN = "torch==2.13.0"
INSTALL_TIMEOUT_S = 900
COMMAND_TIMEOUT_S = 300
# Not copied into the build folder: local environments, build leftovers (setuptools reuses a stale
# build/ and would package files that no longer exist) and outputs.
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "runs",
    ".ipynb_checkpoints",
)

if importlib.util.find_spec("pip") is None or importlib.util.find_spec("ensurepip") is None:
    pytest.skip("needs pip and ensurepip in this interpreter to build the wheel and a virtual environment",
                allow_module_level=True)


def _run(cmd: list[str], timeout: int, **kwargs) -> subprocess.CompletedProcess:
    """Run ``cmd``; fail the test with its output tail if it exits non-zero or runs too long."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(map(str, cmd))} ran longer than {timeout} s")
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{tail}")
    return proc


def _clean_env() -> dict[str, str]:
    """This process's environment without anything that points Python at the checkout."""
    drop = ("PYTHONPATH", "PYTHONHOME", "AF1_DATASETS_DIR", "PYTHONDONTWRITEBYTECODE")  # bytecode: see install
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # small models: one thread is fastest and does not spin on a busy machine
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[dict]:
    """Wheel built and installed into a fresh venv: its paths and the seconds each step took."""
    base = tmp_path_factory.mktemp("wheel")
    times: dict[str, float] = {}
    start = time.perf_counter()
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    wheels = base / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "."], INSTALL_TIMEOUT_S,
         cwd=src, env=_clean_env())
    (wheel,) = wheels.glob("af1_circuits-*.whl")
    times["wheel"] = time.perf_counter() - start

    start = time.perf_counter()
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], INSTALL_TIMEOUT_S)
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / ("python.exe" if os.name == "nt" else "python")
    times["venv"] = time.perf_counter() - start

    start = time.perf_counter()
    # --no-compile: byte-compiling all of transformers would double the install's CPU time; the first
    # command compiles (and caches) only the modules it imports.
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", str(wheel), TORCH_PIN], INSTALL_TIMEOUT_S,
         env=_clean_env())
    times["install"] = time.perf_counter() - start

    work = base / "outside"  # a folder outside the checkout: nothing there can be imported by accident
    work.mkdir()
    yield {"wheel": wheel, "venv": venv, "python": python, "af1": bin_dir / "af1", "work": work, "times": times}
    shutil.rmtree(base, ignore_errors=True)  # the venv holds about 1.5 GB (torch, transformers)


def test_wheel_carries_task_data_and_zoo_models(installed):
    with zipfile.ZipFile(installed["wheel"]) as zf:
        names = set(zf.namelist())
    # datasets/ of the repository ships as circuits/data/ inside the package.
    shipped = [p for folder in ("datasets", "circuits/zoo/models") for p in (ROOT / folder).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    expected = {p.relative_to(ROOT).as_posix().replace("datasets/", "circuits/data/", 1) for p in shipped}
    assert "circuits/data/tasks/catalogue.toml" in expected and "circuits/data/tasks/add.toml" in expected
    assert "circuits/data/examples/mul.toml" in expected and "circuits/data/examples/capital.toml" in expected
    assert "circuits/zoo/models/arith-gpt2/model.safetensors" in expected
    assert any(n.startswith("circuits/data/frozen/") and n.endswith(".jsonl") for n in expected)
    assert expected - names == set(), "files of the checkout missing from the wheel"
    assert not any(n.startswith(("datasets/", "tests/")) for n in names)


def test_installed_package_reads_its_data_from_site_packages(installed):
    probe = (
        "import json, sysconfig, circuits, torch, transformer_lens\n"
        "from importlib.metadata import version\n"
        "from circuits import tasks\n"
        "print(json.dumps({'data': str(tasks.datasets_dir().resolve()), 'package': circuits.__file__,\n"
        "  'purelib': sysconfig.get_paths()['purelib'], 'n_tasks': len(tasks.list_tasks()),\n"
        "  'n_frozen': len(tasks.frozen_set('add')), 'torch': torch.__version__,\n"
        "  'n_mul': len(tasks.frozen_set('examples/mul.toml')),\n"
        "  'tl': version('transformer-lens')}))\n"
    )
    out = _run([str(installed["python"]), "-c", probe], COMMAND_TIMEOUT_S, cwd=installed["work"], env=_clean_env())
    info = json.loads(out.stdout.strip().splitlines()[-1])
    purelib = Path(info["purelib"]).resolve()
    data = Path(info["data"])
    assert data == purelib / "circuits" / "data"
    assert Path(info["package"]).resolve().is_relative_to(purelib)
    assert not data.is_relative_to(ROOT)
    from circuits.tasks.files import toml_module

    catalogue = toml_module().loads((ROOT / "datasets" / "tasks" / "catalogue.toml").read_text())
    assert info["n_tasks"] == len(catalogue["tasks"]) and info["n_frozen"] == catalogue["frozen_n"]
    assert info["n_mul"] == 300  # a shipped example task file, found in the installed data folder
    assert info["torch"].startswith("2.13.0")
    assert info["tl"].split(".")[0] == "4", f"a plain install resolved transformer-lens {info['tl']}, not 4.x"


def test_cli_runs_outside_the_checkout(installed):
    work, env, times = installed["work"], _clean_env(), installed["times"]

    def af1(*args: str) -> str:
        start = time.perf_counter()
        out = _run([str(installed["af1"]), *args], COMMAND_TIMEOUT_S, cwd=work, env=env).stdout
        times[f"af1 {args[0]}"] = time.perf_counter() - start
        return out

    listing = af1("zoo", "list")
    assert "arith-gpt2" in listing and "arith-llama" in listing

    af1("search", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "20", "--no-progress", "--out", "search")
    summary = json.loads((work / "search" / "summary.json").read_text())
    assert (work / "search" / "report.html").is_file()
    assert (summary["model"], summary["task"], summary["n_prompts"]) == ("arith-gpt2", "add_sub", 20)
    assert summary["n_configs_evaluated"] == summary["n_configs_total"] == 28  # 6 blocks: the whole grid
    assert summary["transformer_lens_version"].startswith("4.")

    af1("lens", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "20", "--out", "lens")
    lens = json.loads((work / "lens" / "lens.json").read_text())
    assert (work / "lens" / "report.html").is_file()
    assert (lens["model"], lens["task"], lens["n_prompts"]) == ("arith-gpt2", "add", 20)

    # the command of the issue: failed with "No such file or directory: .../site-packages/datasets/tasks.json"
    af1("demo", "--n-prompts", "20", "--no-progress", "--out", "demo")
    assert (work / "demo" / "report.html").is_file() and (work / "demo" / "necessity" / "report.html").is_file()
    print("wheel test seconds:", {k: round(v, 1) for k, v in times.items()})
