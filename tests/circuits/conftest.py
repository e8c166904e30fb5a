"""The analyses in ``circuits`` are tested on the default backend of the installed TransformerLens
(``HookedTransformer`` on 3.x, ``TransformerBridge`` on 4.x: ``make test`` runs this directory on both);
on 3.9 ``test_backends.py`` checks that a bridge gives its hooked twin's numbers, and the search
(``test_search.py``, its own ``model`` fixture) runs on every available backend.

This ``model`` fixture is its own definition (not an override of ``backend``): a session fixture
shared with ``tests/interventions`` would keep a cached model across the two directories."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import build_default


@pytest.fixture(scope="session")
def model(arch):
    """A tiny random model of one architecture (``arch``): 4 blocks, vocab 40, BOS id 0; a
    ``HookedTransformer`` on TransformerLens 3.x, a ``TransformerBridge`` on 4.x."""
    torch.manual_seed(0)
    return build_default(arch)
