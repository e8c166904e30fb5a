"""Ground-truth models: the structure's masks and hooks, the circuit-size metrics against hand
computations, and (when the planted models are shipped) their accuracy, forbidden attention and the
exact recovery of every planted (wait, transfer) and head set by the search and pruning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import needs_hooked

structure_mod = pytest.importorskip("circuits.zoo.structure")
gt = pytest.importorskip("circuits.groundtruth")
zoo = pytest.importorskip("circuits.zoo")

Structure = structure_mod.Structure


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------ metrics by hand
def test_cpr_cmd_by_hand():
    # sizes 0,1,2,4 of K=4 -> x = 0, .25, .5, 1; trapezoids: .25*(.2+.9)/2 + .25*(.9+1)/2 + .5*1 = .875
    curve = [(0, 0.2), (1, 0.9), (2, 1.0), (4, 1.0)]
    cpr, cmd = gt.cpr_cmd(curve)
    assert cpr == pytest.approx(0.875)
    assert cmd == pytest.approx(0.25 * 0.9 / 2 + 0.25 * 0.1 / 2)  # = 0.125
    assert gt.cpr_cmd([(2, 1.0), (0, 0.0), (1, 0.5)]) == pytest.approx((0.5, 0.5))  # order does not matter


def test_cmd_splits_a_segment_that_crosses_one():
    # |1 - f| goes .2 -> 0 (at x=.5) -> .2: two triangles of area .5*.5*.2 each
    cpr, cmd = gt.cpr_cmd([(0, 1.2), (1, 0.8)])
    assert cpr == pytest.approx(1.0)
    assert cmd == pytest.approx(0.1)


@pytest.mark.parametrize("curve", [[(0, 1.0)], [(1, 0.5), (2, 1.0)], [(0, 0.1), (0, 0.2), (1, 1.0)]])
def test_cpr_cmd_rejects_bad_curves(curve):
    with pytest.raises(ValueError, match="sizes"):
        gt.cpr_cmd(curve)


def test_precision_recall():
    planted = [(3, 0), (3, 1), (4, 2)]
    assert gt.precision_recall([(3, 0), (3, 1)], planted) == (1.0, pytest.approx(2 / 3))
    assert gt.precision_recall([(3, 0), (3, 1), (4, 2), (4, 3)], planted) == (0.75, 1.0)
    assert gt.precision_recall(None, planted) == (0.0, 0.0)


def test_curve_by_size_sorts_by_heads_kept():
    class P:
        def __init__(self, k, f):
            self.n_heads_kept, self.faithfulness = k, f

    assert gt.curve_by_size([P(2, 1.0), P(1, 0.7), P(0, 0.1)]) == [(0, 0.1), (1, 0.7), (2, 1.0)]


# ---------------------------------------------------------------------------- structure and hooks
def test_structure_round_trip_and_checks():
    s = Structure(2, 2, ((0, 1), (2, 3)))
    assert s.blocks == [3, 4] and s.head_set == {(3, 0), (3, 1), (4, 2), (4, 3)}
    assert Structure.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="one head tuple per transfer block"):
        Structure(2, 2, ((0,),))
    with pytest.raises(ValueError, match="does not fit"):
        Structure(4, 2, ((0,), (1,))).check(6, 4)


def test_allowed_mask_written_out():
    m = structure_mod.allowed_mask(Structure(0, 1, ((2,),)), 3, 4, 5).numpy()
    expected = np.zeros((3, 4, 5, 5), bool)
    for q in range(5):
        expected[:, :, q, 0] = expected[:, :, q, q] = True
    expected[1, 2, 4, :] = True  # block 1 = wait+1, head 2, last row: every key
    np.testing.assert_array_equal(m, expected)


@needs_hooked
def test_hard_mask_zeroes_forbidden_attention_and_penalty_is_the_hinge(arch):
    from tests.conftest import build_default, random_tokens

    model = build_default(arch, n_layers=4, d_vocab=40, seed=0)
    s = Structure(1, 2, ((0,), (1, 3)))
    tokens = random_tokens(8, 6, seed=1)
    hooks = structure_mod.ScoreHooks(model, s, margin=3.0, hard=True)
    before = structure_mod.forbidden_mass(model, s, tokens)
    assert before["max_key"] > 0.05  # a random model attends everywhere
    with model.hooks(fwd_hooks=hooks.hooks()):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_pattern", "hook_attn_scores")))
    allowed = structure_mod.allowed_mask(s, 4, model.cfg.n_heads, 6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    for layer in range(4):
        pat = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert float(pat[:, ~allowed[layer]].abs().max()) == 0.0
        torch.testing.assert_close(pat.sum(-1), torch.ones_like(pat.sum(-1)))
    # without the hard mask the pass is the plain one: the penalty, recomputed with plain loops from its scores
    soft = structure_mod.ScoreHooks(model, s, margin=3.0, hard=False)
    with torch.no_grad(), model.hooks(fwd_hooks=soft.hooks()):
        model(tokens)
    with torch.no_grad():
        _, raw = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_attn_scores"))
    expected = 0.0
    for layer in range(4):
        sc = raw[f"blocks.{layer}.attn.hook_attn_scores"]
        n_forbidden = int((causal & ~allowed[layer]).sum())
        for b in range(sc.shape[0]):
            for h in range(sc.shape[1]):
                for q in range(6):
                    ok = [k for k in range(q + 1) if allowed[layer, h, q, k]]
                    lse = torch.logsumexp(sc[b, h, q, ok], 0)
                    for k in range(q + 1):
                        if not allowed[layer, h, q, k]:
                            expected += float(torch.relu(sc[b, h, q, k] - lse + 3.0)) / (sc.shape[0] * n_forbidden * 4)
    assert expected > 0.1
    assert float(soft.penalty) == pytest.approx(expected, rel=1e-4)
