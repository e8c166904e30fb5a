"""A third backend is one adapter class registered with ``register_backend``; the fast search runs on
it through the capabilities it declares (here: none), with the numbers of the naive search."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import interventions as iv
from circuits import search as S
from tests.conftest import BACKENDS, build_model, random_tokens


class Stop(Exception):
    def __init__(self, act: torch.Tensor):
        super().__init__("stop")
        self.act = act


class PlaceholderAdapter(iv.ModelAdapter):
    """No capabilities: every run is a complete forward pass over placeholder ids whose residual
    entering ``start`` is replaced (the blocks before it run on the placeholders)."""

    backend = "placeholder"

    def until(self, forward: Callable[[], Any], name: str, entry: tuple[str, torch.Tensor] | None = None):
        def stop(act, hook=None):
            raise Stop(act)

        hooks = [] if entry is None else [(entry[0], lambda act, hook=None: entry[1])]
        try:
            with self.hooks(hooks + ([(name, stop)] if name else [])):
                return forward()
        except Stop as done:
            return done.act

    def last(self) -> str:
        return f"blocks.{self.info.n_layers - 1}.hook_resid_post"

    def embed(self, tokens):
        return self.until(lambda: self.model(tokens), "blocks.0.hook_resid_pre")

    def run_to_resid(self, tokens):
        return self.until(lambda: self.model(tokens), self.last())

    def forward_from(self, resid, start, stop, positions):
        n = self.info.n_layers
        entry = f"blocks.{start}.hook_resid_pre" if start < n else self.last()
        exit_name = None if stop is None else (f"blocks.{stop}.hook_resid_pre" if stop < n else self.last())
        placeholder = torch.zeros(resid.shape[:2], dtype=torch.long)
        return self.until(lambda: self.model(placeholder), exit_name, (entry, resid))


iv.register_backend(lambda model: getattr(model, "use_placeholder_backend", False), PlaceholderAdapter)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_third_backend_runs_the_fast_search(arch):
    model = build_model(arch, BACKENDS[0])
    model.use_placeholder_backend = True
    ad = iv.adapt(model)
    assert type(ad) is PlaceholderAdapter and ad.capabilities == iv.Capabilities()
    tokens = random_tokens(16, 6, seed=9, values=5)
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    cache = iv.MeanCache.fit(model, tokens, progress=False)
    fast = S.FastEvaluator(model, tokens, answers, cache, "cama", 16)
    # learned positions need no capability for the [BOS, last] tail; rotary ones fall back to every position
    assert fast.tail == ("pair" if arch == "gpt2" else "full")
    naive = S.NaiveEvaluator(model, tokens, answers, cache, "cama", 16)
    for w, t in S.configurations(4):
        cf, _, df = fast.evaluate(w, t)
        cn, _, dn = naive.evaluate(w, t)
        assert torch.equal(cf, cn), (w, t)
        torch.testing.assert_close(df, dn, atol=1e-4, rtol=0)
    with pytest.raises(NotImplementedError, match=r"does not implement run_from\(positions=\.\.\.\) \(capability positions\)"):
        ad.run_from(torch.zeros(1, 2, 32), 0, positions=torch.tensor([0, 3]))
