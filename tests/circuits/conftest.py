"""The analyses in ``circuits`` (search, pruning, lens, commands) are tested on the HookedTransformer
backend. The interventions they build on are tested on both backends (``tests/interventions``); the
search's fast evaluator uses HookedTransformer internals (its key-value cache and rotary tables), so
the ``circuits`` tests do not run on TransformerBridge models yet (see docs/backends.md)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", params=("hooked",))
def backend(request) -> str:
    return request.param
