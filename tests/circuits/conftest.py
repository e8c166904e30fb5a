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


@pytest.fixture
def counted(monkeypatch):
    """Counts of the prompt checks (``tasks.filter_correct``, the runner's ``base_correct``), the fit-set draws
    and the means fits made from now on (a rerun of a finished directory makes none)."""
    import interventions as iv
    from circuits import runner
    from circuits.prompts import fitset
    from circuits.tasks import catalogue as tasks

    calls = {"filter_correct": 0, "base_correct": 0, "draw_fit_set": 0, "MeanCache.fit": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(tasks, "filter_correct", counting("filter_correct", tasks.filter_correct))
    monkeypatch.setattr(runner, "base_correct", counting("base_correct", runner.base_correct))
    monkeypatch.setattr(fitset, "draw_fit_set", counting("draw_fit_set", fitset.draw_fit_set))
    monkeypatch.setattr(iv.MeanCache, "fit", classmethod(counting("MeanCache.fit", iv.MeanCache.fit.__func__)))
    return calls
