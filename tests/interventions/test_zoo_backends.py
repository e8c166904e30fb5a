"""Zoo models load as either backend: the same tokens and answer everywhere, equal logits on both."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import BACKENDS, needs_hooked, zoo_float64_atol

zoo = pytest.importorskip("circuits.zoo")

PROMPT = "42+20-15="
NAMES = zoo.available()


@pytest.fixture(scope="module", params=NAMES or [pytest.param(None, marks=pytest.mark.skip(reason="no zoo models"))])
def name(request) -> str:
    return request.param


def test_default_backend_is_hooked_where_available():
    import interventions as iv

    assert iv.adapt(zoo.load(zoo.DEFAULT_MODEL)).backend == BACKENDS[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_and_accuracy_are_the_same_on_every_backend(name, backend):
    """Same tokens on every backend, and the model's card accuracy is reproduced (also on 4.x, where
    there is no HookedTransformer to compare with): first 100 frozen prompts within 0.1 of the card (add_sub, or
    the first task a model's card records where it was not trained on add_sub, e.g. arith-mul's task file)."""
    from circuits.tasks import catalogue as tasks

    model = zoo.load(name, backend=backend)
    assert not model.training
    tokens = model.to_tokens(PROMPT)
    assert model.to_str_tokens(PROMPT) == ["<bos>", "42", "+", "20", "-", "15", "="]
    assert tokens[0, 0].item() == model.tokenizer.bos_token_id and tokens.shape == (1, 7)
    card = zoo.card(name)
    task = "add_sub" if "add_sub" in card["frozen_accuracy"] else next(iter(card["frozen_accuracy"]))
    with torch.no_grad():
        _, acc = tasks.filter_correct(model, tasks.frozen_set(task).select(range(100)))
    assert abs(acc - card["frozen_accuracy"][task]) <= 0.1, (acc, card["frozen_accuracy"][task])


@needs_hooked
def test_backends_give_equal_logits(name):
    """Equal logits on both backends, compared in float64 so that kernel rounding does not count
    (tolerance: ``zoo_float64_atol``)."""
    hooked, bridge = zoo.load(name, backend="hooked"), zoo.load(name, backend="bridge")
    hooked, bridge = hooked.to(torch.float64), bridge.to(torch.float64)
    atol = zoo_float64_atol(zoo.card(name))
    with torch.no_grad():
        for prompt in (PROMPT, "120+31-5=", "7+8+9="):
            tokens = hooked.to_tokens(prompt)
            assert torch.equal(bridge.to_tokens(prompt), tokens)
            out = bridge(tokens)
            assert out.dtype == torch.float64
            torch.testing.assert_close(out, hooked(tokens), atol=atol, rtol=0)


def test_bad_backend_is_rejected():
    with pytest.raises(ValueError, match="backend='jax'"):
        zoo.load(zoo.DEFAULT_MODEL, backend="jax")
