"""Planted AF1 model: the mask is part of the model, the AF1 search recovers it, accuracy holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interventions as iv
from tests.conftest import needs_hooked

planted = pytest.importorskip("circuits.zoo.planted")
zoo = pytest.importorskip("circuits.zoo")

NAME = planted.NAME
SPEC = planted.CONFIG.planted


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


# ------------------------------------------------------------------------------ the shipped model
@pytest.fixture(scope="module")
def af1_model():
    if NAME not in zoo.available():
        pytest.skip(f"{NAME} weights are absent: re-create them with `af1 zoo train arith-gpt2-af1`")
    return zoo.load(NAME)


def test_config_records_mask(af1_model):
    import json

    cfg = json.loads((zoo.model_dir(NAME) / "zoo.json").read_text())
    assert cfg["planted"] == SPEC
    assert zoo.card(NAME)["planted"]["last_full"] == SPEC["last_full"]


def test_plain_forward_obeys_mask(af1_model):
    tokens = af1_model.to_tokens(["42+20-15=", "7-3+60=", "99-98-1="])
    with torch.inference_mode():
        _, cache = af1_model.run_with_cache(tokens)
    n = tokens.shape[1]
    for layer in range(af1_model.cfg.n_layers):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"]
        allowed = torch.from_numpy(brute_mask(n, layer, SPEC))
        assert float(pat[..., ~allowed].abs().max()) == 0.0, f"block {layer} attends to a forbidden key"
        assert float(pat[..., allowed].min()) > 0.0  # softmax over the allowed keys


def test_search_recovers_planted_structure(af1_model):
    from circuits.loading import prepare_prompts
    from circuits.search import search_af1

    p = prepare_prompts(af1_model, "add", 60, seed=0, oversample=20, min_prompts=10)
    res = search_af1(af1_model, p.tokens, p.answers, grid="full", progress=False, n_boot=100)
    f = res.faithfulness_map()
    assert res.selected is not None and res.selected.config == (2, 2), res.table()
    assert f[(2, 2)] == 1.0  # CAMA at wait=2 is exact by construction
    assert f[(2, 1)] < 0.9 and f[(3, 1)] < 0.9


def test_frozen_accuracy_matches_card(af1_model):
    from circuits.zoo.train import ORIGINAL_TASKS, evaluate_frozen

    record = zoo.card(NAME)["frozen_accuracy"]
    got = evaluate_frozen(af1_model, ORIGINAL_TASKS)
    for task in ORIGINAL_TASKS:
        assert got[task] >= record[task] - 0.03, (task, got[task], record[task])


@needs_hooked  # export writes HookedTransformer weights (training needs TransformerLens 3.x)
def test_export_writes_a_card_with_the_search(af1_model, tmp_path):
    """``planted.export`` (what ``train`` ends with) writes a loadable model whose card records the
    mask, the one-phase training and the AF1 search re-run on the written model."""
    state = {"step": 7, "wall_s": 1.5, "history": [], "threads": 1, "batch_size": 256, "lr": 3e-4,
             "warmup": 50, "min_lr_frac": 0.05, "d_vocab": af1_model.cfg.d_vocab}
    from circuits.commands.zoo import af1_check

    card = planted.export(af1_model, planted.CONFIG, planted.train_config(planted.CONFIG), tmp_path, state,
                          check=lambda folder: af1_check(folder, n_build=400))
    assert card["planted"]["last_full"] == SPEC["last_full"]
    assert card["phases"] == [{"phase": 1, "steps": 7, "batch_size": 256, "lr": 3e-4, "warmup": 50,
                               "min_lr_frac": 0.05, "wall_time_s": 1.5, "threads": 1,
                               "d_vocab": af1_model.cfg.d_vocab}]
    assert card["train"]["phases"] == [] and card["train"]["init_from"] == "arith-gpt2"
    search = card["af1_search"]
    assert search["summary"].startswith("selected wait=2, transfer=2") and search["faithfulness"]["2,2"] == 1.0
    reloaded = zoo.load_dir(tmp_path)
    tokens = af1_model.to_tokens("42+20-15=")
    torch.testing.assert_close(reloaded(tokens), af1_model(tokens))

