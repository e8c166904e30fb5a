"""Most analyses in ``circuits`` (pruning, lens, commands) are tested on the HookedTransformer backend;
the search (``test_search.py``, its own ``model`` fixture) runs on every available backend, and the
interventions they all build on are tested on both backends (``tests/interventions``).

This ``model`` fixture is its own definition (not an override of ``backend``): a session fixture
shared with ``tests/interventions`` would keep a cached model across the two directories."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_hooked


@pytest.fixture(scope="session")
def model(arch):
    """A tiny random HookedTransformer of one architecture (``arch``): 4 blocks, vocab 40, BOS id 0."""
    torch.manual_seed(0)
    return build_hooked(arch)
