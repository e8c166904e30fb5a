"""Ground-truth models: the structure's masks and hooks, the circuit-size metrics against hand
computations, and (when the planted models are shipped) their accuracy, forbidden attention and the
exact recovery of every planted (wait, transfer) and head set by the search and pruning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import needs_hooked

structure_mod = pytest.importorskip("circuits.zoo.structure")
gt = pytest.importorskip("circuits.groundtruth")
zoo = pytest.importorskip("circuits.zoo")

Structure = structure_mod.Structure


pytestmark = pytest.mark.usefixtures("one_thread")


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


# ------------------------------------------------------------------------------- training pieces
def test_penalty_weight_schedule():
    import dataclasses

    from circuits.zoo.groundtruth import GROUND_TRUTHS, penalty_weight

    cfg = dataclasses.replace(GROUND_TRUTHS["arith-llama-gt-w1t2"], pen_start=2500, pen_ramp=1000, pen_weight=0.1,
                              ramp_steps=0)
    assert [penalty_weight(cfg, s) for s in (0, 2500, 3000, 3500, 9000)] == pytest.approx([0, 0, 0.05, 0.1, 0.1])
    ramped = dataclasses.replace(cfg, pen_start=0, pen_ramp=1, pen_weight=1.0, ramp_steps=1000)  # grows with the ramp
    assert [penalty_weight(ramped, s) for s in (0, 250, 1000, 5000)] == pytest.approx([0, 0.25, 1.0, 1.0])


@needs_hooked
def test_a_recipe_whose_start_is_not_shipped_is_refused_in_one_line(tmp_path, capsys):
    """arith-gpt2-gt-w2t2 starts from the former arith-gpt2-af1, no longer shipped: training it says how to
    get those weights, before any step and without writing anything."""
    from circuits.cli import main
    from circuits.zoo.groundtruth import GROUND_TRUTHS

    assert GROUND_TRUTHS["arith-gpt2-gt-w2t2"].base == "arith-gpt2-af1"
    if (zoo.MODELS_DIR / "arith-gpt2-af1" / "model.safetensors").exists():
        pytest.skip("arith-gpt2-af1 is restored in this checkout")
    assert main(["zoo", "train", "arith-gpt2-gt-w2t2", "--steps", "1", "--out", str(tmp_path / "m"),
                 "--ckpt", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "starts from the weights of arith-gpt2-af1, which are not shipped" in err
    assert "git checkout 645c8c7 -- circuits/zoo/models/arith-gpt2-af1" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "c").exists()


@needs_hooked
def test_w3t1_names_the_w2t2_weights_it_started_from(tmp_path, capsys):
    """w3t1 started from w2t2 after its phase 4; w2t2 has a fifth phase since, so the recipe names that start,
    which is not shipped, and training it says in one line how to restore it (the command is checked here)."""
    import subprocess

    from circuits.cli import main
    from circuits.zoo.groundtruth import GROUND_TRUTHS

    assert GROUND_TRUTHS["arith-gpt2-gt-w3t1"].base == "arith-gpt2-gt-w2t2-phase4"
    assert main(["zoo", "train", "arith-gpt2-gt-w3t1", "--steps", "1", "--out", str(tmp_path / "m"),
                 "--ckpt", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "arith-gpt2-gt-w2t2-phase4, which are not shipped" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "c").exists()
    restore = err.split("`")[1].replace("d=circuits/zoo/models/", f"d={tmp_path}/")
    repo = Path(__file__).resolve().parents[2]
    if subprocess.run(["git", "cat-file", "-e", "0e0b2ed"], cwd=repo, capture_output=True).returncode:
        pytest.skip("not a checkout with the commit the weights are restored from")
    subprocess.run(restore, shell=True, cwd=repo, check=True)
    card = json.loads((tmp_path / "arith-gpt2-gt-w2t2-phase4" / "card.json").read_text())
    assert card["name"] == "arith-gpt2-gt-w2t2" and len(card["phases"]) == 4


def test_layout_batches_mix_every_task_without_padding():
    from types import SimpleNamespace

    from circuits.zoo.data import TaskData, layout_batches
    from circuits.zoo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    train = [TaskData(name, np.array(ops), tok) for name, ops in
             [("add", [[1, 2], [3, 4]]), ("sub", [[9, 1]]), ("add_sub", [[5, 6, 7], [8, 9, 1]])]]
    cfg = SimpleNamespace(seed=3, batch_size=64)
    groups = layout_batches(train, 7, cfg)
    assert [g[0].shape[1] for g in groups] == [5, 7] and sum(len(g[0]) for g in groups) == 64
    for toks, ans in groups:
        assert (toks[:, 0] == tok.bos_token_id).all() and len(ans) == len(toks)
    short, long = groups
    sums = {int(a) for a in short[1]}  # 1+2, 3+4, 9-1 as answer token ids
    assert sums <= {tok.get_vocab()[str(v)] for v in (3, 7, 8)} and len(sums) == 3
    assert {tok.get_vocab()[str(v)] for v in (4, 16)} == {int(a) for a in long[1]}  # 5+6-7, 8+9-1
    again = layout_batches(train, 7, cfg)
    assert all((a[0] == b[0]).all() for a, b in zip(groups, again))  # a function of the step
    # The draws of the recipes trained before answer balancing existed, replayed by hand: unchanged.
    rng = np.random.default_rng([3, 7])
    task_idx = rng.integers(0, 3, size=64)
    by_len: dict = {}
    for t in np.unique(task_idx):
        pick = rng.integers(0, len(train[t].tokens), size=int((task_idx == t).sum()))
        by_len.setdefault(train[t].tokens.shape[1], []).append(train[t].tokens[pick])
    assert all((np.concatenate(by_len[n]) == g[0]).all() for n, g in zip(sorted(by_len), groups))


def test_answer_balanced_draws_make_every_answer_equally_likely():
    """``add_add``'s sums 0..297: uniform tuples give the largest sums a few times in 10^4 (one tuple gives 297);
    answer-balanced draws give each answer value 1/298 of the rows (within 5 standard errors), half of them at
    ``answer_balance=0.5``, and every drawn row is a row with that answer."""
    from types import SimpleNamespace

    from circuits.zoo.data import TaskData, answer_balanced, layout_batches
    from circuits.zoo.tokenizer import build_tokenizer

    g = np.stack(np.meshgrid(*[np.arange(100)] * 3, indexing="ij"), -1).reshape(-1, 3)  # every tuple
    data = TaskData("add_add", g, build_tokenizer())
    rows = answer_balanced(data, np.random.default_rng(0), 200_000)
    sums = g[rows].sum(1)
    counts = np.bincount(sums, minlength=298)
    present = np.unique(g.sum(1))
    assert len(present) == 298 and (counts[present] > 0).all()
    expected = 200_000 / len(present)
    assert np.abs(counts[present] - expected).max() < 5 * np.sqrt(expected)
    assert (data.answer_values[rows] == sums).all()
    cfg = SimpleNamespace(seed=1, batch_size=4000)
    mixed = layout_batches([data], 0, cfg, answer_balance=0.5)[0][1]
    plain = layout_batches([data], 0, cfg)[0][1]
    big = data.answers[g.sum(1) >= 250]
    share = lambda ans: np.isin(ans, big).mean()  # noqa: E731
    # uniform: 1.9% of tuples sum to >= 250; balanced: 48 of 298 answers; half and half in between
    assert share(plain) < 0.03 and 0.07 < share(mixed) < 0.11


@needs_hooked
def test_head_dropout_spares_the_designated_heads(arch):
    from circuits.zoo.groundtruth import head_dropout_hooks

    s = Structure(0, 2, ((1,), (0, 3)))
    hooks = dict(head_dropout_hooks(s, 4, 0.5))
    assert set(hooks) == {"blocks.1.attn.hook_z", "blocks.2.attn.hook_z"}
    torch.manual_seed(0)
    z = torch.ones(2000, 3, 4, 8)
    out1, out2 = hooks["blocks.1.attn.hook_z"](z, None), hooks["blocks.2.attn.hook_z"](z, None)
    assert bool((out1[:, :, 1] == 1).all()) and bool((out2[:, :, [0, 3]] == 1).all())
    kept = out1[:, 0, [0, 2, 3], 0].mean().item()
    assert 0.45 < kept < 0.55  # the others are zeroed with probability 0.5, per prompt
    assert bool((out1 == out1[:, :1]).all())  # the same heads at every position of a prompt
    assert head_dropout_hooks(s, 4, 0.0) == []


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


def test_windows_split_the_operands():
    s = Structure(2, 2, ((1,), (0, 2)), (("first",), ("last", "all")))
    assert s.window(3, 1) == "first" and s.window(4, 0) == "last" and s.window(4, 2) == "all" and s.window(4, 1) is None
    # A op B = (5 tokens) and A op B op C = (7 tokens): "first" is A / A op1 B, "last" the last op and operand
    assert structure_mod.window_keys("first", 5) == [1] and structure_mod.window_keys("last", 5) == [2, 3]
    assert structure_mod.window_keys("first", 7) == [1, 2, 3] and structure_mod.window_keys("last", 7) == [4, 5]
    m = structure_mod.allowed_mask(s, 6, 4, 7)
    assert m[3, 1, 6].nonzero().flatten().tolist() == [0, 1, 2, 3, 6]
    assert m[4, 0, 6].nonzero().flatten().tolist() == [0, 4, 5, 6]
    assert m[4, 2, 6].all() and m[4, 1, 6].nonzero().flatten().tolist() == [0, 6]
    assert Structure.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="windows"):
        Structure(2, 1, ((1,),), (("middle",),))


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


# ------------------------------------------------------------------------- the shipped ground truths
def shipped() -> list[str]:
    return gt.planted_models()


@pytest.fixture(scope="module", params=sorted(pytest.importorskip("circuits.zoo.groundtruth").GROUND_TRUTHS))
def planted(request):
    name = request.param
    if name not in shipped():
        pytest.skip(f"{name} is not shipped: train it with `af1 zoo train {name}`")
    return name, zoo.load(name), gt.planted_structure(name)


def test_ground_truth_is_accurate_and_its_structure_holds_without_hooks(planted):
    from circuits.zoo.data import evaluate_frozen
    from circuits.zoo.groundtruth import measure
    from circuits.zoo.recipes import ORIGINAL_TASKS

    name, model, structure = planted
    assert "planted" not in zoo.card(name)  # no attention-mask hooks are attached at load time
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())
    acc = evaluate_frozen(model, ORIGINAL_TASKS)
    assert min(acc.values()) >= 0.95, acc
    mass = measure(model, structure)
    assert mass["max_key"] < 1e-3, mass
    assert mass["max_key"] == pytest.approx(zoo.card(name)["forbidden_mass"]["max_key"], rel=1e-3, abs=1e-7)


def test_the_card_records_the_recipe(planted):
    """The card's ``groundtruth_train`` is the registered recipe (every phase, the margin phase included), and
    the last step, the unembedding refit, is recorded: the folder has no bias beside it."""
    import dataclasses
    import json

    from circuits.zoo.groundtruth import GROUND_TRUTHS

    name, model, _ = planted
    card = zoo.card(name)
    recipe = json.loads(json.dumps(dataclasses.asdict(GROUND_TRUTHS[name])))
    defaults = {f.name: f.default for f in dataclasses.fields(GROUND_TRUTHS[name])}
    later = set(recipe) - set(card["groundtruth_train"])  # fields added after the card was written: at their defaults
    assert all(recipe[k] == defaults[k] for k in later), later
    assert card["groundtruth_train"] == {k: v for k, v in recipe.items() if k not in later}
    assert len(card["phases"]) == 1 + len(GROUND_TRUTHS[name].phases)
    refit = card["unembed_refit"]
    if refit["method"] == "none":  # continued from a folder (no bias) and ended by a readout phase (bias kept at 0)
        assert GROUND_TRUTHS[name].phases[-1].get("readout") and card["phases"][-1]["steps"] == 0
    else:
        assert refit["method"] in ("fold", "distil") and refit["val"]["argmax_same"] > 0.99
    assert not (zoo.path(name) / "unembed_bias.safetensors").exists()
    assert float(model.unembed.b_U.detach().abs().max()) == 0.0


def test_search_and_pruning_recover_the_planted_structure(planted):
    """The AF1 search (200 prompts, full grid, CAMA) selects exactly the planted (wait, transfer), and
    greedy pruning at 0.9 keeps exactly the planted heads. (With disjoint windows every designated head is
    the only reader of its keys, so necessary by construction; with full windows, as in w2t2, the model
    could have used fewer heads than it may use, and this checks that it uses them all.)"""
    from circuits.prompts.spec import PromptSpec

    name, model, structure = planted
    prompts = PromptSpec("add_sub", 200, seed=0).prepare(model, means="cama", progress=False)
    row = gt.recover(model, name, structure, prompts, "cama", task="add_sub")
    assert row.n_prompts == 200
    assert row.selected == (structure.wait, structure.transfer), row
    assert row.faithfulness_planted >= 0.99
    assert row.found_heads == sorted(structure.head_set), row
    assert (row.precision, row.recall) == (1.0, 1.0)
    assert row.curve[-1][1] == row.faithfulness_planted and row.curve[0][1] < 0.2
    assert row.cpr == pytest.approx(gt.cpr_cmd(row.curve)[0]) and row.cpr + row.cmd == pytest.approx(1.0)


def test_a_planted_mask_folder_reads_as_its_structure(tmp_path):
    """A folder of the former mask-based kind: its spec becomes wait = first full block - 1, transfer = the
    full blocks, every head of them designated with the full window; it is no zoo model, so not listed."""
    from tests.conftest import planted_mask_folder

    if "arith-gpt2" not in zoo.available():
        pytest.skip("arith-gpt2 is not shipped")
    s = gt.planted_structure(str(planted_mask_folder(tmp_path)))
    assert (s.wait, s.transfer) == (2, 2) and s.blocks == [3, 4]
    assert s.head_set == {(b, h) for b in (3, 4) for h in range(4)}
    assert set(w for ws in s.windows for w in ws) == {"all"}
    assert "planted" not in gt.planted_models()


def test_a_deprecated_name_loads_its_replacement_loudly(monkeypatch):
    """The alias mechanism that redirects ``arith-gpt2-af1`` (tested on a stand-in alias to ``arith-gpt2``):
    zoo.load and load_model resolve it with a FutureWarning."""
    from circuits.models.loading import load_model

    if "arith-gpt2" not in zoo.available():
        pytest.skip("arith-gpt2 is not shipped")
    monkeypatch.setitem(zoo.ALIASES, "arith-gpt2-old", "arith-gpt2")
    with pytest.warns(FutureWarning, match="'arith-gpt2-old' is deprecated .*loading 'arith-gpt2'"):
        model = zoo.load("arith-gpt2-old")
    tokens = model.to_tokens("42+20-15=")
    expected = zoo.load("arith-gpt2")(tokens)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), expected)
        with pytest.warns(FutureWarning, match="deprecated"):
            torch.testing.assert_close(load_model("arith-gpt2-old")(tokens), expected)
    with pytest.raises(ValueError, match="unknown zoo model 'nope'"):
        zoo.model_dir("nope")


def test_former_planted_name_loads_its_replacement_loudly():
    if "arith-gpt2-gt-w2t2" not in shipped():
        pytest.skip("arith-gpt2-gt-w2t2 is not shipped")
    if (zoo.MODELS_DIR / "arith-gpt2-af1" / "model.safetensors").exists():
        pytest.skip("arith-gpt2-af1 is still shipped under its own name")
    with pytest.warns(FutureWarning, match="arith-gpt2-af1.*deprecated.*arith-gpt2-gt-w2t2"):
        model = zoo.load("arith-gpt2-af1")
    tokens = model.to_tokens("42+20-15=")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), zoo.load("arith-gpt2-gt-w2t2")(tokens))
    assert gt.planted_structure("arith-gpt2-gt-w2t2").to_dict()["wait"] == 2


def test_cli_writes_the_recovery_table(tmp_path, capsys, monkeypatch):
    import csv
    import json

    from circuits.cli import main

    planted = shipped()
    if not planted:
        pytest.skip("no planted zoo model is shipped")
    # a window design: each designated head is the only reader of its keys, so 40 prompts recover them
    name = next((n for n in ("arith-llama-gt-w1t2", "arith-gpt2-gt-w3t1") if n in planted), planted[0])
    s = gt.planted_structure(name)
    out = tmp_path / "gt"
    assert main(["groundtruth", "--models", name, "--ablations", "cama,zero", "--n-prompts", "40",
                 "--no-progress", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert [r["ablation"] for r in rows] == ["cama", "zero"]
    assert rows[0]["selected"] == rows[0]["planted"] == f"({s.wait}, {s.transfer})"
    assert rows[0]["config_recovered"] == rows[0]["heads_recovered"] == "True"
    assert float(rows[0]["cpr"]) + float(rows[0]["cmd"]) == pytest.approx(1.0, abs=1e-3)
    assert (out / "figures" / f"{name}-add_sub.svg").read_text().startswith("<svg")
    assert f"| {name} | add_sub | cama | ({s.wait}, {s.transfer}) | ({s.wait}, {s.transfer}) ✓" in (out / "table.md").read_text()
    assert (out / "runs" / name / "add_sub" / "cama" / "prune" / "summary.json").is_file()
    # another threshold only reselects: the searches' stored results, nothing evaluated
    from circuits.search import evaluators
    from circuits.search.rule import select

    calls = []
    for cls in (evaluators.FastEvaluator, evaluators.NaiveEvaluator):
        monkeypatch.setattr(cls, "evaluate", lambda self, w, t: calls.append((w, t)))
    assert main(["groundtruth", "--models", name, "--ablations", "cama,zero", "--n-prompts", "40", "--threshold",
                 "0.3", "--no-progress", "--out", str(out)]) == 0
    assert calls == []
    for row in csv.DictReader((out / "table.csv").open()):
        search = out / "runs" / name / "add_sub" / row["ablation"] / "search" / "results.jsonl"
        records = [json.loads(line) for line in search.read_text().splitlines()]
        chosen = select({(r["wait"], r["transfer"]): r["faithfulness"] for r in records}, 0.3)
        assert row["selected"] == (f"({chosen[0]}, {chosen[1]})" if chosen else "None")
    assert main(["groundtruth", "--ablations", "cama,bogus", "--out", str(out)]) == 2
    assert "--ablations" in capsys.readouterr().err
