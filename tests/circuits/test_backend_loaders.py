"""The loader registry: loading and the zoo ask it how a backend builds a model and never test a backend's name."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from circuits import zoo
from circuits.errors import ArgumentError
from circuits.models import loaders as backend_loaders
from circuits.models import loading
from interventions.vocab import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def counting_bridge(monkeypatch):
    """The bridge's registered loader replaced by one that records its calls and builds as the original does."""
    calls: list[tuple[str, object]] = []
    original = backend_loaders.get_loader("bridge")

    def pretrained(request):
        calls.append(("pretrained", request))
        return original.pretrained(request)

    def from_hf(hf_model, tokenizer, folder, b_U, device):
        calls.append(("from_hf", folder.name))
        return original.from_hf(hf_model, tokenizer, folder, b_U, device)

    monkeypatch.setitem(backend_loaders._LOADERS, "bridge", replace(original, pretrained=pretrained, from_hf=from_hf))
    return calls


def test_zoo_models_and_local_folders_are_built_by_the_registered_loader(counting_bridge, tmp_path):
    model = loading.load_model("arith-gpt2", backend="bridge")
    assert counting_bridge == [("from_hf", "arith-gpt2")]
    # a zoo model's folder is an ordinary local Hugging Face folder: the pretrained route, the same distribution
    # (compatibility mode centres the unembedding: logits move by a constant per position)
    counting_bridge.clear()
    folder = loading.load_model(str(zoo.path("arith-gpt2")), backend="bridge")
    (kind, request), = counting_bridge
    assert kind == "pretrained" and request.local and request.source == str(zoo.path("arith-gpt2"))
    assert request.dtype is None and request.device == "cpu" and request.device_map is None
    tokens = model.to_tokens("42+20-15=")
    with torch.no_grad():
        torch.testing.assert_close(folder(tokens).log_softmax(-1), model(tokens).log_softmax(-1), atol=1e-4, rtol=0)


def test_every_backend_of_the_vocabulary_has_a_loader_and_remote_is_the_loaders_say():
    assert set(backend_loaders.loader_names()) == set(BACKENDS)
    assert backend_loaders.remote_backends() == ["nnsight"]
    with pytest.raises(ArgumentError, match=r"no loader is registered for backend 'tpu'; registered: bridge, hooked"):
        backend_loaders.get_loader("tpu")


def test_a_failure_names_the_registered_loaders_call(monkeypatch):
    original = backend_loaders.get_loader("bridge")

    def fail(request):
        raise OSError("no such file")

    monkeypatch.setitem(backend_loaders._LOADERS, "bridge", replace(original, pretrained=fail, label="MyLoader.load"))
    from circuits.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"MyLoader.load failed \(OSError: no such file\)"):
        loading.load_model("gpt2", backend="bridge")


@pytest.mark.parametrize("module", ["circuits/models/loading.py", "circuits/zoo/__init__.py", "circuits/commands/common.py"])
def test_loading_and_the_zoo_never_compare_a_backend_name(module):
    """No `backend == "bridge"`, `backend != "hooked"` or `backend in ("bridge", "nnsight")` in the modules that
    load models: a new backend is a loader registration, not an edit here."""
    tree = ast.parse((ROOT / module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] for c in ([c] if not isinstance(c, ast.Tuple) else c.elts)
                      if isinstance(c, ast.Constant) and c.value in BACKENDS]
            if consts:
                found.append(ast.unparse(node))
    assert not found, found
