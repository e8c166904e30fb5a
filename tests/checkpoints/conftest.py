"""Stand-in checkpoints (``tests/standins.py``) in a session-wide offline Hugging Face cache.

The cache is built once per session into a temporary folder (a few seconds); while a test uses
``standin_hub`` the hub reads only that folder, offline. ``load_standin`` caches loaded models per
``(key, backend, dtype)``: tests must not modify them."""

from __future__ import annotations

import pytest

from tests import standins
from tests.conftest import BACKENDS


@pytest.fixture(scope="session")
def standin_hub(tmp_path_factory):
    """The folder of the stand-in cache, active (offline) for the whole session."""
    root = standins.build_cache(tmp_path_factory.mktemp("hf") / "hub")
    with standins.offline_cache(root):
        yield root


@pytest.fixture(scope="session")
def load_standin(standin_hub):
    """``load_standin(key, backend, dtype=None)``: ``circuits.loading.load_model`` of stand-in ``key``."""
    from circuits import loading

    cache: dict = {}

    def load(key: str, backend: str, dtype: str | None = None):
        if (key, backend, dtype) not in cache:
            cache[key, backend, dtype] = loading.load_model(standins.STANDINS[key].repo, backend=backend, dtype=dtype)
        return cache[key, backend, dtype]

    return load


def combos(keys=None):
    """``(key, backend)`` pairs of the stand-ins on this TransformerLens, as pytest params."""
    return [pytest.param(k, b, id=f"{k}-{b}") for k in (keys or standins.STANDINS) for b in BACKENDS]
