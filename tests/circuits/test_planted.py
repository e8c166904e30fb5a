"""Planted attention masks (``circuits.zoo.mask`` / ``circuits.zoo.planted``): the permanent-hook mask that
``zoo.load`` reattaches from a folder's ``zoo.json``. The shipped planted models are the ground truths of
``tests/circuits/test_groundtruth.py`` (structure in the weights, no hooks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interventions as iv
from tests.conftest import needs_hooked

planted = pytest.importorskip("circuits.zoo.planted")
zoo = pytest.importorskip("circuits.zoo")

SPEC = planted.CONFIG.planted


pytestmark = pytest.mark.usefixtures("one_thread")


def brute_mask(n_pos: int, layer: int, spec: dict) -> np.ndarray:
    """Allowed (query, key) pairs of block ``layer``, written out independently of interventions."""
    allowed = np.zeros((n_pos, n_pos), bool)
    for q in range(n_pos):
        allowed[q, 0] = allowed[q, q] = True
    if layer in spec["last_full"]:
        allowed[n_pos - 1, :] = True
    return allowed


# ------------------------------------------------------------------------ tiny random model (no zoo)
def test_attach_matches_peeks_and_survives_reset(arch):
    from tests.conftest import build_default, random_tokens

    spec = {"self_all": [0, 3], "last_full": [1, 2]}
    model = build_default(arch, n_layers=4, d_vocab=40, seed=0)
    tokens = random_tokens(8, 6, seed=1)
    with torch.inference_mode():
        expected = iv.run(model, tokens, planted.planted_peeks(spec))
        plain = model(tokens)
        planted.attach_planted_mask(model, spec)
        model.reset_hooks()  # permanent hooks must stay
        got = model(tokens)
        _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(got, expected)
    assert (got - plain).abs().max() > 1e-3  # the mask really changes the model
    for layer in range(4):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"]
        forbidden = torch.from_numpy(~brute_mask(6, layer, spec))
        assert float(pat[..., forbidden].abs().max()) == 0.0
        torch.testing.assert_close(pat.sum(-1), torch.ones_like(pat.sum(-1)))


@pytest.mark.parametrize("spec", [{"self_all": [0, 1]}, {"self_all": [0, 1], "last_full": [1, 2, 3]},
                                  {"self_all": [0, 1], "last_full": [2, 4]}])
def test_bad_spec(spec):
    with pytest.raises(ValueError, match="planted spec"):
        planted.check_spec(spec, 4)


# ------------------------------------------------------------------- export of a masked model
@pytest.fixture(scope="module")
def masked_model():
    if "arith-gpt2" not in zoo.available():
        pytest.skip("arith-gpt2 weights are absent")
    return planted.attach_planted_mask(zoo.load("arith-gpt2"), SPEC)


def test_plain_forward_obeys_mask(masked_model):
    tokens = masked_model.to_tokens(["42+20-15=", "7-3+60=", "99-98-1="])
    with torch.inference_mode():
        _, cache = masked_model.run_with_cache(tokens)
    n = tokens.shape[1]
    for layer in range(masked_model.cfg.n_layers):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"]
        allowed = torch.from_numpy(brute_mask(n, layer, SPEC))
        assert float(pat[..., ~allowed].abs().max()) == 0.0, f"block {layer} attends to a forbidden key"
        assert float(pat[..., allowed].min()) > 0.0  # softmax over the allowed keys


@needs_hooked  # export writes HookedTransformer weights (training needs TransformerLens 3.x)
def test_export_writes_a_card_with_the_mask(masked_model, tmp_path):
    """``planted.export`` (what ``planted.train`` ends with) writes a loadable model whose ``zoo.json`` and
    card record the mask (reattached on load) and whose card records the one-phase training and ``check``."""
    import json

    state = {"step": 7, "wall_s": 1.5, "history": [], "threads": 1, "batch_size": 256, "lr": 3e-4,
             "warmup": 50, "min_lr_frac": 0.05, "d_vocab": masked_model.cfg.d_vocab}
    card = planted.export(masked_model, planted.CONFIG, planted.train_config(planted.CONFIG), tmp_path, state,
                          check=lambda folder: {"folder": folder.name})
    assert card["planted"]["last_full"] == SPEC["last_full"]
    assert json.loads((tmp_path / "zoo.json").read_text())["planted"] == SPEC
    assert card["phases"] == [{"phase": 1, "steps": 7, "batch_size": 256, "lr": 3e-4, "warmup": 50,
                               "min_lr_frac": 0.05, "wall_time_s": 1.5, "threads": 1,
                               "d_vocab": masked_model.cfg.d_vocab}]
    assert card["train"]["phases"] == [] and card["train"]["init_from"] == "arith-gpt2"
    assert card["af1_search"] == {"folder": tmp_path.name}
    reloaded = zoo.load_dir(tmp_path)  # the mask is reattached from zoo.json
    tokens = masked_model.to_tokens("42+20-15=")
    torch.testing.assert_close(reloaded(tokens), masked_model(tokens))
