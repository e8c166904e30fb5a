"""The embedded model zoo: offline loading, tokenizer, accuracy bars, cards, CLI and training loop."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # loading must never need the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json
from functools import cache

import pytest
import torch

from circuits import zoo
from circuits.tasks import catalogue as tasks
from circuits.zoo import export as zoo_export
from circuits.zoo import hf as zoo_hf
from circuits.zoo import train as zoo_train
from tests.conftest import has_hooked_transformer, needs_hooked

MODELS = ["arith-gpt2", "arith-llama", "arith-styles"]
ORIGINAL = ["add", "sub", "add_add", "add_sub", "sub_add", "sub_sub"]
N_EVAL = 30  # first N prompts of each frozen set (of 300): a subset, checked exactly against the card
N_CHECK = 20  # prompts per task on which the independent tasks.filter_correct path is compared


@cache
def _model(name):
    return zoo.load(name)


def test_available_and_default():
    assert set(MODELS) <= set(zoo.available())
    assert zoo.DEFAULT_MODEL == "arith-gpt2"


def test_unknown_model_lists_names():
    with pytest.raises(ValueError, match="unknown zoo model 'gpt5'.*arith-gpt2.*arith-llama"):
        zoo.load("gpt5")
    with pytest.raises(ValueError, match="arith-styles"):
        zoo.card("gpt5")


@pytest.mark.parametrize("name", MODELS)
def test_tokens_and_answer_of_42_plus_20_minus_15(name):
    model = _model(name)
    assert not model.training
    toks = model.to_tokens("42+20-15=")
    assert toks.shape == (1, 7)
    assert model.to_str_tokens("42+20-15=") == ["<bos>", "42", "+", "20", "-", "15", "="]
    assert toks[0, 0].item() == model.tokenizer.bos_token_id
    with torch.no_grad():
        logits = model(toks)
    got = model.to_string(logits[0, -1].argmax().reshape(1))
    # The default model must answer it (the running example of the docs); the others may miss it only
    # while their card records add_sub below the bar.
    if got != "47" and name != zoo.DEFAULT_MODEL and not zoo.card(name)["meets_bar"].get("add_sub", True):
        pytest.xfail(f"{name} answers 42+20-15= with {got}; its card records add_sub below the bar")
    assert got == "47"


@pytest.mark.parametrize("name", MODELS)
def test_architecture_and_vocabulary(name):
    model = _model(name)
    cfg = model.cfg
    assert cfg.n_layers >= 6
    vocab = model.tokenizer.get_vocab()
    assert all(str(i) in vocab for i in range(521))
    assert all(len(model.tokenizer.tokenize(str(i))) == 1 for i in (0, 7, 99, 100, 297, 520))
    assert {"+", "-", "=", "<bos>", "<pad>", "<unk>", "sum", "print"} <= set(vocab)
    if name in ("arith-llama", "arith-styles"):  # arith-styles is fine-tuned from arith-llama
        assert cfg.normalization_type == "RMS" and cfg.positional_embedding_type == "rotary"
        assert cfg.n_key_value_heads == 2 and cfg.n_heads == 4 and cfg.gated_mlp and cfg.act_fn == "silu"
    else:
        assert cfg.normalization_type == "LN" and cfg.positional_embedding_type == "standard"
        assert not cfg.gated_mlp and cfg.act_fn.startswith("gelu")


@cache
def _measured(name):
    """Accuracy on the first ``N_EVAL`` prompts of each trained task's frozen set (vectorised evaluation)."""
    return zoo_train.evaluate_frozen(_model(name), zoo.card(name)["train"]["tasks"], n=N_EVAL)


@pytest.mark.parametrize("name", MODELS)
def test_accuracy_matches_card(name):
    """Regression check against the card, whose accuracies count correct answers among all 300 prompts of
    each frozen set: the first ``N_EVAL`` prompts are a subset, so their number of correct answers must lie
    in [k300 - (300 - N_EVAL), min(N_EVAL, k300)] exactly (no statistics involved). Every trained task is
    far above chance (1/521). On the first prompts of the first trained task the independent path
    ``tasks.filter_correct`` (text prompts through the tokenizer) gives the same accuracy."""
    card = zoo.card(name)
    for task, acc in _measured(name).items():
        k300 = round(card["frozen_accuracy"][task] * 300)
        k = round(acc * N_EVAL)
        assert k300 - (300 - N_EVAL) <= k <= min(N_EVAL, k300), (task, k, k300)
        assert acc >= 0.1, f"{name} on {task}: {acc:.3f}"
    model = _model(name)
    for task in card["train"]["tasks"][:1]:
        ds = tasks.frozen_set(task).select(range(N_CHECK))
        fast = zoo_train.evaluate_frozen(model, [task], n=N_CHECK)[task]
        assert tasks.filter_correct(model, ds)[1] == pytest.approx(fast, abs=1e-9), task


@pytest.mark.parametrize("name", MODELS)
def test_accuracy_bar_on_frozen_sets(name):
    """The project's bar: >= 95% on every Original task, >= 90% on every trained style.
    A model whose card records a miss is an expected failure until it is retrained (see docs/zoo.md)."""
    card = zoo.card(name)
    misses = {}
    for task, acc in _measured(name).items():
        bar = card["bars"][task]
        assert bar >= (0.95 if task in ORIGINAL else 0.90)
        if acc < bar:
            misses[task] = round(acc, 3)
    if misses and not all(card["meets_bar"].values()):
        pytest.xfail(f"{name} is below its bar (recorded on its card): {misses}")
    assert not misses, f"{name} below bar: {misses}"


def test_styles_model_covers_the_input_styles():
    card = zoo.card("arith-styles")
    styles = [t for t in card["train"]["tasks"] if t not in ORIGINAL]
    skipped = card.get("skipped_styles", [])
    assert len(styles) + len(skipped) == 10
    assert set(ORIGINAL) <= set(card["train"]["tasks"])


def test_cards_describe_training():
    for name in MODELS:
        c = zoo.card(name)
        assert c["name"] == name and c["steps_run"] > 0 and c["wall_time_s"] > 0
        assert isinstance(c["seed"], int)
        assert set(c["frozen_accuracy"]) >= set(c["train"]["tasks"])
        files = {p.name for p in zoo.model_dir(name).iterdir()}
        assert {"model.safetensors", "config.json", "tokenizer.json", "card.json"} <= files
        assert not any(f.endswith((".pt", ".pth", ".bin", ".pkl", ".ckpt")) for f in files)


def test_filter_correct_drops_wrong_answers():
    model = _model("arith-gpt2")
    from datasets import concatenate_datasets

    good = tasks.frozen_set("sub").select(range(40))
    bad = good.map(lambda r: {"answer": r["answer"] + 300})  # far off: no model predicts these
    good_kept, good_acc = tasks.filter_correct(model, good)
    assert good_acc >= 0.6
    kept, acc = tasks.filter_correct(model, concatenate_datasets([good, bad]))
    assert acc == pytest.approx(good_acc / 2)
    assert kept["prompt"] == good_kept["prompt"] and kept["answer"] == good_kept["answer"]


def test_frozen_sets_are_held_out_of_training():
    cfg = zoo_train.get_config("arith-gpt2")
    import dataclasses

    small = dataclasses.replace(cfg, tasks=["add", "sub"])
    tr, va = zoo_train.build_splits(small, zoo.load("arith-gpt2").tokenizer)
    for split in tr + va:
        seen = {tuple(map(int, r)) for r in split.ops}
        for task in ("add", "add_small", "verbal_add") if split.name == "add" else ("sub", "sub_small"):
            frozen = {tuple(r) for r in tasks.frozen_set(task)["operands"]}
            assert not (seen & frozen), f"{task} frozen tuples in the {split.name} training data"
    assert len(tr[0].ops) > 8000 and len(va[0].ops) == 200


def test_cli_list_and_eval(capsys):
    from circuits.cli import main

    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in MODELS)
    met = zoo.card("arith-gpt2")["meets_bar"]
    expected = 0 if (met["add"] and met["sub"]) else 1  # exit 1 when a task is below its bar
    assert main(["zoo", "eval", "arith-gpt2", "--tasks", "add", "sub", "-n", "30"]) == expected
    out = capsys.readouterr().out
    assert out.count("(bar 0.95)") == 2
    assert main(["zoo", "eval", "nope"]) == 2


@needs_hooked
@pytest.mark.parametrize("base", ["arith-llama"])  # rotary + GQA: the harder reload; gpt2 reload is covered by the shipped model
def test_train_phases_checkpoint_resume_and_load(tmp_path, monkeypatch, base):
    """A tiny registered two-phase model: trains phase 1 then phase 2 (larger batch) from phase 1's
    weights, writes safetensors only, skips finished phases on resume, continues an extended phase from
    its checkpoint, is reproduced bit for bit from scratch, and the exported folder loads back through
    ``zoo.load`` with identical logits."""
    import dataclasses

    from safetensors.torch import load_file

    tiny = dataclasses.replace(zoo_train.get_config(base), name="tiny", tasks=["add", "sub"],
                               bars={"add": 0.0, "sub": 0.0}, n_layers=1, d_model=32, d_head=8, d_mlp=64,
                               batch_size=16, steps=3, eval_every=2, ckpt_every=2, eval_n=10,
                               phases=[zoo_train.Phase(steps=2, batch_size=24, lr=1e-3, warmup=1,
                                                       eval_every=1, ckpt_every=1)])
    monkeypatch.setitem(zoo_train.REGISTRY, "tiny", tiny)
    monkeypatch.setattr(zoo_export, "evaluate_frozen", lambda m, names, n=None: {t: 0.0 for t in names})
    monkeypatch.setattr(zoo_export, "evaluate_fresh", lambda m, names, **kw: {t: [0.0] for t in names})
    p1 = zoo_train.phase_configs(tiny)
    assert [(c.phase, c.steps, c.batch_size, c.lr) for c in p1] == [(1, 3, 16, tiny.lr), (2, 2, 24, 1e-3)]
    out, ck = tmp_path / "models" / "tiny", tmp_path / "ck"
    card = zoo_train.train("tiny", out_dir=out, ckpt_dir=ck, threads=1, progress=False)
    assert card["steps_run"] == 5
    assert [(p["phase"], p["steps"], p["batch_size"]) for p in card["phases"]] == [(1, 3, 16), (2, 2, 24)]
    assert card["wall_time_s"] == pytest.approx(sum(p["wall_time_s"] for p in card["phases"]), abs=0.2)
    s1 = json.loads((ck / "phase1" / "state.json").read_text())
    s2 = json.loads((ck / "phase2" / "state.json").read_text())
    assert (s1["step"], [h["step"] for h in s1["history"]]) == (3, [2, 3])
    assert (s2["step"], [h["step"] for h in s2["history"]]) == (2, [1, 2])
    for d in ("phase1", "phase2"):
        assert {p.name for p in (ck / d).iterdir()} == {"checkpoint.safetensors", "optimizer.safetensors", "state.json"}
    assert {"model.safetensors", "config.json", "tokenizer.json", "card.json", "card.md"} <= {p.name for p in out.iterdir()}
    w_a = load_file(str(out / "model.safetensors"))
    w_p1 = zoo_hf.hf_state_from_hooked(tiny.model_config(len(zoo_train.build_tokenizer())),
                                       load_file(str(ck / "phase1" / "checkpoint.safetensors")))
    assert any(not torch.equal(w_p1[k], w_a[k]) for k in w_a)  # phase 2 moved the weights

    # one command from scratch reproduces the model exactly (seeded weights and batches)
    card_b = zoo_train.train("tiny", out_dir=tmp_path / "b", ckpt_dir=tmp_path / "ck_b", threads=1, progress=False)
    w_b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a) and card_b["steps_run"] == 5
    # finished phases are loaded, not rerun
    zoo_train.train("tiny", out_dir=tmp_path / "c", ckpt_dir=ck, threads=1, progress=False)
    w_c = load_file(str(tmp_path / "c" / "model.safetensors"))
    assert all(torch.equal(w_a[k], w_c[k]) for k in w_a)
    # extending the last phase resumes it from its checkpoint (optimizer state included)
    card = zoo_train.train("tiny", out_dir=out, ckpt_dir=ck, steps=4, threads=1, progress=False)
    assert card["steps_run"] == 7 and json.loads((ck / "phase2" / "state.json").read_text())["step"] == 4
    w7 = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(w_a[k], w7[k]) for k in w_a)
    opt = load_file(str(ck / "phase2" / "optimizer.safetensors"))
    assert any(k.endswith("::exp_avg_sq") for k in opt)
    # the exported folder is a loadable zoo model
    # the exported folder is a loadable zoo model: the last checkpoint with its unembedding refitted without
    # a bias (recorded on the card), and no bias file beside it
    from circuits.zoo.refit import refit_unembed

    monkeypatch.setattr(zoo, "MODELS_DIR", tmp_path / "models")
    assert zoo.available() == ["tiny"]
    loaded = zoo.load("tiny")
    ref = zoo_train.new_model(tiny, loaded.tokenizer)
    ref.load_state_dict(load_file(str(ck / "phase2" / "checkpoint.safetensors")), strict=False)
    ref.eval()
    assert float(ref.unembed.b_U.detach().abs().max()) > 0  # trained with a bias
    report = refit_unembed(ref, tiny)  # the refit export ran, redone on the checkpoint
    assert report["method"] == card["unembed_refit"]["method"] == ("distil" if base == "arith-llama" else "fold")
    assert report["val"]["kl_mean"] == pytest.approx(card["unembed_refit"]["val"]["kl_mean"], rel=1e-4, abs=1e-12)
    toks = loaded.to_tokens(["12+30=", "99-7="])
    with torch.no_grad():
        assert torch.allclose(loaded(toks), ref(toks), atol=1e-5)
    assert not (out / "unembed_bias.safetensors").exists()
    assert loaded.cfg.n_key_value_heads == (2 if base == "arith-llama" else None)


@needs_hooked
def test_grown_vocabulary_keeps_shared_rows():
    """A checkpoint with a shorter vocabulary (565 tokens, before 'the') fills the shared rows/columns."""
    cfg = zoo_train.get_config("arith-gpt2")
    import dataclasses

    small = dataclasses.replace(cfg, n_layers=1, d_model=32, d_head=8, d_mlp=32)
    tok = zoo_train.build_tokenizer()
    model = zoo_train.new_model(small, tok)
    own = {k: v.clone() for k, v in model.state_dict().items()}
    old = {"embed.W_E": torch.randn(len(tok) - 1, 32), "unembed.W_U": torch.randn(32, len(tok) - 1)}
    zoo_train.load_weights(model, old, "test")
    assert torch.equal(model.embed.W_E[:-1], old["embed.W_E"]) and torch.equal(model.embed.W_E[-1], own["embed.W_E"][-1])
    assert torch.equal(model.unembed.W_U[:, :-1], old["unembed.W_U"])
    with pytest.raises(ValueError, match="embed.W_E has shape"):
        zoo_train.load_weights(model, {"embed.W_E": torch.randn(len(tok) + 1, 32)}, "test")


@pytest.mark.parametrize("task", ["add_sub", "instruction_sub", "python_add", "word_problem_sub"])
def test_training_tokens_match_the_tokenizer(task):
    """The vectorised training data must be exactly what the model sees for the prompt text."""
    model = _model("arith-styles")
    ds = tasks.frozen_set(task).select(range(5))
    import numpy as np

    data = zoo_train.TaskData(task, np.array(ds["operands"]), model.tokenizer)
    for i, row in enumerate(ds):
        assert data.tokens[i].tolist() == model.to_tokens(row["prompt"])[0].tolist()
        assert model.to_string(torch.tensor([int(data.answers[i])])) == str(row["answer"])



@pytest.mark.skipif(has_hooked_transformer(), reason="TransformerLens 4.x only (no HookedTransformer)")
def test_training_on_transformer_lens_4_says_what_to_do():
    from circuits.zoo.tokenizer import build_tokenizer

    with pytest.raises(RuntimeError, match=r"training a zoo model needs a HookedTransformer.*transformer-lens>=3\.9,<4.*backend='bridge'"):
        zoo_train.new_model(zoo_train.get_config("arith-gpt2"), build_tokenizer(), "hooked")
    # the default model class on 4.x is the Hugging Face model (trained with plain PyTorch)
    assert type(zoo_train.new_model(zoo_train.get_config("arith-gpt2"), build_tokenizer())).__name__ == "GPT2LMHeadModel"


def test_export_refuses_a_bridge(tmp_path):
    """Export writes HookedTransformer parameter names; a bridge's state dict would not load back."""
    bridge = zoo.load("arith-gpt2", backend="bridge")
    with pytest.raises(RuntimeError, match="exporting a zoo model needs a HookedTransformer"):
        zoo_train.export(bridge, zoo_train.get_config("arith-gpt2"), tmp_path, [{"step": 1, "wall_s": 0.0}])
    assert not (tmp_path / "model.safetensors").exists()


def test_fresh_operands_are_build_task_without_the_frozen_set():
    from circuits.zoo.data import fresh_operands

    frozen = {tuple(o) for o in tasks.frozen_set("sub")["operands"]}
    expected = tasks.build_task("sub", 300, seed=7, exclude=frozen)["operands"]
    assert fresh_operands("sub", 300, seed=7).tolist() == expected
    assert not frozen & {tuple(o) for o in expected}


@pytest.mark.parametrize("name", zoo.available())
def test_fresh_draw_reproduces_the_card_and_clears_the_bar(name):
    """Beyond the frozen sets: a fresh draw (seed 1, 300 prompts, frozen prompts excluded) of the two trained
    tasks nearest the bar on the card is measured again and equals the card's record (which lists three
    seeds for every trained task), and clears the bar. A model whose card records a fresh-draw miss is an
    expected failure until it is retrained (see docs/groundtruth.md)."""
    from circuits.zoo.data import FRESH_N, evaluate_fresh

    card = zoo.card(name)
    fresh = card["fresh_accuracy"]
    assert fresh["seeds"][0] == 1 and fresh["n"] == FRESH_N and set(fresh["accuracy"]) == set(card["train"]["tasks"])
    nearest = sorted(fresh["accuracy"], key=lambda t: min(fresh["accuracy"][t]) - card["bars"][t])[:2]
    measured = evaluate_fresh(_model(name), nearest, seeds=(1,))
    for task in nearest:
        assert round(measured[task][0] * FRESH_N) == round(fresh["accuracy"][task][0] * FRESH_N), task
    misses = {t: accs for t, accs in fresh["accuracy"].items() if min(accs) < card["bars"][t]}
    assert card["meets_bar_fresh"] == {t: t not in misses for t in fresh["accuracy"]}
    if misses:
        pytest.xfail(f"{name} is below its bar on fresh draws (recorded on its card): {misses}")
