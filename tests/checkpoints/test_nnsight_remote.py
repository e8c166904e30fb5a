"""The remote path of the nnsight backend, offline: a model loaded for NDIF (config and tokenizer only,
weights on the meta device) builds and serialises its request exactly as for a real run; the request is
caught before anything connects. The API key comes from ``NDIF_API_KEY`` and is not in the payload."""

from __future__ import annotations

import pytest

import interventions as iv
from circuits.models import loading
from circuits.search.cost import search_cost
from tests import standins

pytest.importorskip("nnsight", reason="nnsight is not installed: pip install 'af1-circuits[nnsight]'")

FAKE_KEY = "test-key-not-a-real-one-1234567890"


class Caught(Exception):
    """Raised instead of connecting to NDIF; carries what would have been sent."""


@pytest.fixture
def caught_requests(monkeypatch):
    """Every remote request: ``(model key, api key, payload bytes)``; none is sent."""
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.modeling import huggingface

    # nnsight asks the Hub for the canonical repository name of the model key: answered here, offline.
    repo = standins.STANDINS["llama3"].repo
    monkeypatch.setitem(huggingface._ID_CACHE, repo, repo)
    sent: list[tuple[str, str, bytes]] = []

    def request(self, request, tracer):
        sent.append((self.model_key, self.api_key, self._serialize(tracer)))
        raise Caught("not sent")

    monkeypatch.setattr(RemoteBackend, "request", request)
    monkeypatch.setenv("NDIF_API_KEY", FAKE_KEY)
    return sent


def test_remote_request_is_built_and_serialised_without_sending(standin_hub, caught_requests):
    model = loading.load_model(standins.STANDINS["llama3"].repo, backend="nnsight", remote=True)
    assert model.hf.model.embed_tokens.weight.device.type == "meta"  # no weights here
    ad = iv.adapt(model)
    assert ad.edit_problems == {} and ad.device().type == "cpu"  # no probe request; tensors built on the CPU
    tokens = model.to_tokens(["12+3=", "40+7="], prepend_bos=True)
    L = model.cfg.n_layers
    runs = [(tokens, iv.af1_subgraph(L, w, t, ablation="zero")) for w, t in ((0, 0), (0, 1), (-1, 1))]
    with pytest.raises(Caught):
        iv.run_many(model, runs)
    assert len(caught_requests) == 1  # three configurations, one request
    key, api_key, payload = caught_requests[0]
    assert "Meta-Llama-3-8B" in key and api_key == FAKE_KEY
    assert len(payload) > 1000 and FAKE_KEY.encode() not in payload
    assert model.usage.requests == 0  # nothing came back, nothing is counted
    with pytest.raises(ValueError, match="has no weights here: decoding residual states"):
        _ = model.unembed


def test_remote_needs_the_key_in_the_environment(standin_hub, monkeypatch):
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    with pytest.raises(ValueError, match="^cannot load model .*--remote needs an NDIF API key in the environment: "
                                         "export NDIF_API_KEY=..."):
        loading.load_model(standins.STANDINS["gpt2"].repo, backend="nnsight", remote=True)
    with pytest.raises(ValueError, match="needs backend='nnsight'"):
        loading.load_model("arith-gpt2", backend="bridge", remote=True)
    with pytest.raises(ValueError, match="is not hosted on NDIF"):
        loading.load_model("arith-gpt2", backend="nnsight", remote=True)


def test_cost_of_a_70b_search():
    """The numbers docs/remote.md quotes: Llama-3.1-70B (80 blocks), 200 prompts of 7 tokens, 128 per pass,
    means fitted on the default 10000 fit prompts."""
    cost = search_cost(80, 200, 7, batch_size=128, configs_per_pass=8, n_fit=10_000)
    assert cost.configs == 81 * 82 // 2 == 3321
    assert cost.search_requests == 2 * sum(-(-(80 - w) // 8) for w in range(-1, 80)) == 902
    assert cost.setup_requests == 2 + 79 and cost.tokens == (3321 * 200 + 200 + 10_000) * 7
    assert search_cost(80, 200, 7, batch_size=128, configs_per_pass=81).search_requests == 162


def test_remote_search_served_by_a_stand_in_server(standin_hub, load_standin, monkeypatch):
    """The whole remote path: a meta-device skeleton here, each request serialised as for NDIF and run by a
    "server" holding the same checkpoint's weights (nnsight's LocalSimulationBackend resolving the
    request's modules to the server's). The search equals a local one and costs what it was estimated to."""
    from nnsight.intervention.backends.local import LocalSimulationBackend
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.modeling import huggingface

    from circuits.search import search_af1

    repo = standins.STANDINS["llama3"].repo
    monkeypatch.setitem(huggingface._ID_CACHE, repo, repo)
    monkeypatch.setenv("NDIF_API_KEY", FAKE_KEY)
    server = load_standin("llama3", "nnsight")
    keys: list[str] = []

    def serve(self, tracer):
        keys.append(self.api_key)
        return LocalSimulationBackend(server.lm)(tracer)

    monkeypatch.setattr(RemoteBackend, "__call__", serve)
    client = loading.load_model(repo, backend="nnsight", remote=True)
    p = standins.self_answered(server, "add", 24, prepend_bos=True)
    local = search_af1(server, p.tokens, p.answers, fit=p.fit, grid="full", progress=False, n_boot=10, configs_per_pass=3)
    remote = search_af1(client, p.tokens, p.answers, fit=p.fit, grid="full", progress=False, n_boot=10, configs_per_pass=3)
    rows = lambda r: {c.config: (c.n_faithful, round(c.mean_answer_prob, 5)) for c in r.results}  # noqa: E731
    assert rows(remote) == rows(local) and remote.base_accuracy == 1.0
    cost = search_cost(client.cfg.n_layers, 24, int(p.tokens.shape[1]), batch_size=128, configs_per_pass=3,
                       n_fit=len(p.fit))
    assert (client.usage.requests, client.usage.tokens) == (cost.requests, cost.tokens) == (len(keys), cost.tokens)
    assert set(keys) == {FAKE_KEY}
    from circuits.tasks import (
        catalogue as tasks,  # prompt checks put their inputs on the CPU, not on the skeleton's meta device
    )

    ds = tasks.build_task("add", 16, seed=0)
    assert tasks.filter_correct(client, ds)[0]["prompt"] == tasks.filter_correct(server, ds)[0]["prompt"]
