"""Continuing a ground truth's recipe from a model folder (``af1 zoo train NAME --continue-from FOLDER``) and a
phase that ends with its best evaluation (``keep_best``): the states come from the folder's card, the weights
from the folder, and the kept weights are the ones whose held-out accuracy the phase recorded (measured again
here)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import needs_hooked

gtrain = pytest.importorskip("circuits.zoo.groundtruth")
zoo = pytest.importorskip("circuits.zoo")

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "arith-gpt2-gt-w2t2"


def shipped_card() -> dict:
    if NAME not in zoo.available():
        pytest.skip(f"{NAME} is not shipped")
    return zoo.card(NAME)


def with_phases(n_later: int, extra: tuple = ()) -> gtrain.GroundTruthConfig:
    """The registered recipe cut to ``n_later`` phases after the first, plus ``extra``."""
    cfg = gtrain.GROUND_TRUTHS[NAME]
    return dataclasses.replace(cfg, phases=cfg.phases[:n_later] + extra)


@needs_hooked
def test_a_recipe_continues_from_a_folder_and_ends_with_its_best_evaluation(tmp_path):
    from circuits.zoo.data import accuracy, build_splits

    card = shipped_card()
    done = len(card["phases"])
    extra = {"steps": 6, "eval_every": 2, "eval_n": 20, "keep_best": True, "lr": 1e-4, "warmup": 1, "seed": 99,
             "pen_start": 0, "pen_ramp": 1}
    cfg = with_phases(done - 1, (extra,))
    model, states = gtrain.continued(cfg, zoo.MODELS_DIR / NAME)
    assert [s["step"] for s in states] == [p["steps"] for p in card["phases"]] and all(s["finished"] for s in states)
    assert [s["mask_off_step"] for s in states] == card["mask_off_step"]
    tokens = model.to_tokens(["42+20-15=", "7+8+9="])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), zoo.load(NAME)(tokens))

    phase = gtrain.phase_list(cfg)[-1]
    state = gtrain.run_phase(model, phase, tmp_path / "ck", resume=True, log=lambda *a: None)
    assert state["step"] == 6 and state["finished"] and [h["step"] for h in state["history"]] == [2, 4, 6]
    off = state["mask_off_step"]  # the evaluations from then on, under the mass target, are candidates
    assert off is not None
    scores = {h["step"]: min(h["val"].values()) for h in state["history"]
              if h["step"] >= off and h["max_key"] < phase.mass_target}
    best = max(sorted(scores), key=lambda s: (scores[s], s))  # ties: the later evaluation
    assert state["best"] == {"step": best, "min_val": scores[best]}
    assert f"weights of step {best}" in state["note"]
    _, val = build_splits(gtrain.train_config(phase), model.tokenizer)
    model.eval()
    assert min(accuracy(model, d) for d in val) == pytest.approx(scores[best])  # the kept weights, measured again
    again = gtrain.run_phase(model, phase, tmp_path / "ck", resume=True, log=lambda *a: None)  # finished: loaded
    assert again["best"] == state["best"]


@needs_hooked
def test_continuing_from_a_folder_of_another_recipe_is_refused(tmp_path, capsys):
    from circuits.cli import main
    from circuits.errors import ArgumentError

    card = shipped_card()
    done = len(card["phases"])
    with pytest.raises(ArgumentError, match=f"its card records {done} phase\\(s\\) of another recipe or all"):
        gtrain.continued(with_phases(done - 1), zoo.MODELS_DIR / NAME)  # nothing left to run
    with pytest.raises(ArgumentError, match="of another recipe"):
        gtrain.continued(gtrain.GROUND_TRUTHS["arith-gpt2-gt-w3t1"], zoo.MODELS_DIR / NAME)
    with pytest.raises(ArgumentError, match="is no ground-truth card"):
        gtrain.continued(with_phases(done), tmp_path)
    argv = ["zoo", "train", "arith-gpt2", "--continue-from", str(zoo.MODELS_DIR / NAME), "--out", str(tmp_path / "m")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--continue-from continues a ground truth's recipe" in err
    assert not (tmp_path / "m").exists()


@needs_hooked
def test_a_readout_phase_refits_the_unembedding_alone_to_the_answers(tmp_path):
    """A phase with ``readout`` moves ``W_U`` and nothing else (so every attention pattern, the structure, is
    unchanged), and lowers the answers' cross-entropy on its fit prompts: those prompts are drawn again here
    by hand and scored through full forward passes, before (the folder's weights) and after."""
    import numpy as np
    import torch.nn.functional as F

    from circuits.zoo.data import accuracy, answer_balanced, build_splits

    card = shipped_card()
    extra = {"steps": 0, "readout": 30, "answer_balance": 0.5, "task_weights": {"add_add": 2.0}, "seed": 5}
    cfg = with_phases(len(card["phases"]) - 1, (extra,))
    model, _ = gtrain.continued(cfg, zoo.MODELS_DIR / NAME)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    phase = gtrain.phase_list(cfg)[-1]
    state = gtrain.run_phase(model, phase, tmp_path / "ck", resume=True, log=lambda *a: None)
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, start[k])] == ["unembed.W_U"]
    assert state["finished"] and state["step"] == 0 and "no other weight changed" in state["note"]

    train, val = build_splits(gtrain.train_config(phase), model.tokenizer)
    rng = np.random.default_rng(5)
    rows = []
    for d in train:  # add_add twice (its weight), half of each task's rows answer-balanced
        k = 30 * (2 if d.name == "add_add" else 1)
        idx = np.concatenate([rng.integers(0, len(d.tokens), size=k - k // 2), answer_balanced(d, rng, k // 2)])
        rows.append((torch.from_numpy(d.tokens[idx]), torch.from_numpy(d.answers[idx])))
    assert state["readout"]["n"] == sum(len(a) for _, a in rows) == 7 * 30

    def ce(m) -> float:
        with torch.no_grad():
            return float(torch.cat([F.cross_entropy(m(t)[:, -1], a, reduction="none") for t, a in rows]).mean())

    fitted, before = ce(model), ce(zoo.load(NAME))
    assert fitted == pytest.approx(state["readout"]["ce_after"], rel=1e-4)
    assert before == pytest.approx(state["readout"]["ce_before"], rel=1e-4)
    assert fitted < 0.9 * before
    model.eval()
    assert state["history"][-1]["val"] == {d.name: accuracy(model, d) for d in val}

    again = zoo.load(NAME)  # a finished readout phase is loaded on resume, not refitted
    loaded = gtrain.run_phase(again, phase, tmp_path / "ck", resume=True, log=lambda *a: None)
    assert loaded["readout"] == state["readout"]
    assert torch.equal(again.unembed.W_U, model.unembed.W_U)
