"""Reliability, third round: per-prompt outcomes checked against the totals, model folders of absurd size refused
from their config, `af1 zoo train` under the lock, a sweep with failed cells exits 2, crafted inputs through the
command line, reruns of finished directories that recompute nothing, and no TransformerLens chatter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from circuits import cli, results
from circuits.errors import CorruptRunError
from circuits.store import files
from circuits.store.outcomes import encode_mask
from tests.circuits.test_reliability2 import one_line_error, tiny  # noqa: F401 - a fixture
from tests.circuits.test_reliability2 import search as search_n
from tests.conftest import build_default

N = 37
"""Prompts of the searches here: not a multiple of 8, so a mask has bits past the last prompt."""


def search(tiny, out: Path):
    return search_n(tiny, out, n=N)


@pytest.fixture
def finished(tiny, tmp_path):
    out = tmp_path / "run"
    search(tiny, out)
    return out


# --- per-prompt outcomes -------------------------------------------------------------------------------------
def mixed_line(out: Path) -> tuple[int, dict]:
    """The first record with faithful and unfaithful prompts (0-based line index and the record)."""
    rows = [json.loads(line) for line in (out / files.SEARCH_RESULTS).read_text().splitlines()]
    return next((i, r) for i, r in enumerate(rows) if 0 < r["n_faithful"] < r["n"])


def forge(out: Path, index: int, **change) -> None:
    path = out / files.SEARCH_RESULTS
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[index].update(change)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def flipped_mask(rec: dict) -> str:
    """The record's mask with every prompt marked faithful."""
    return encode_mask(np.ones(rec["n"], dtype=bool))


CASES = {
    "not hex": (lambda r: {"prompt_faithful": "zz" * ((r["n"] + 7) // 8)}, "'prompt_faithful' = 'zzzz"),
    "short mask": (lambda r: {"prompt_faithful": r["prompt_faithful"][:-2]}, "'prompt_faithful' has 8 hexadecimal digits, but 37 prompts need 10"),
    "mask not a string": (lambda r: {"prompt_faithful": 12}, "'prompt_faithful' must be a hexadecimal string"),
    "probabilities not a list": (lambda r: {"prompt_answer_prob": "0.5"}, "'prompt_answer_prob' must be a list of 37"),
    "too few probabilities": (lambda r: {"prompt_answer_prob": r["prompt_answer_prob"][:-1]}, "'prompt_answer_prob' holds 36 values for n = 37"),
    "probability above 1": (lambda r: {"prompt_answer_prob": [1.5] + r["prompt_answer_prob"][1:]}, "'prompt_answer_prob' value 0 = 1.5 is not a probability"),
    "margin not a number": (lambda r: {"prompt_logit_diff": ["x"] + r["prompt_logit_diff"][1:]}, "'prompt_logit_diff' value 0 = 'x' is not a finite number"),
    # per-prompt outcomes that contradict the totals
    "all marked faithful": (lambda r: {"prompt_faithful": flipped_mask(r)}, "'prompt_faithful' marks 37 faithful prompts, but n_faithful ="),
    "mask and count forged together": (lambda r: {"prompt_faithful": flipped_mask(r), "n_faithful": 37, "faithfulness": 1.0,
                                                 "ci_low": 1.0, "ci_high": 1.0},
                                       "'prompt_logit_diff' value"),
    "bits past n": (lambda r: {"prompt_faithful": r["prompt_faithful"][:-2] + "ff"}, "'prompt_faithful' sets bits past prompt 36"),
    "mean probability": (lambda r: {"prompt_answer_prob": [min(1.0, v + 0.1) for v in r["prompt_answer_prob"]]},
                         "'prompt_answer_prob' averages"),
    "mean margin": (lambda r: {"mean_logit_diff": r["mean_logit_diff"] + 0.01}, "'prompt_logit_diff' averages"),
    "interval": (lambda r: {"ci_low": r["ci_low"] - 0.01}, "'ci_low' = "),
}


@pytest.mark.parametrize("case", CASES)
def test_per_prompt_outcomes_are_checked_on_resume_and_on_load(finished, tiny, case):
    change, expected = CASES[case]
    index, rec = mixed_line(finished)
    forge(finished, index, **change(rec))
    where = f"{finished / files.SEARCH_RESULTS}, line {index + 1}: field {expected}"
    for attempt in (lambda: search(tiny, finished), lambda: results.load(finished)):
        with pytest.raises(CorruptRunError) as err:
            attempt()
        message, code = cli.describe(err.value)
        assert code == 2 and "\n" not in message and where in message, message


def test_consistent_per_prompt_outcomes_load_and_resume(finished, tiny):
    """The checks pass the records a search writes (the same prompts, totals and intervals)."""
    loaded = results.load(finished)
    index, rec = mixed_line(finished)
    config = loaded.result(rec["wait"], rec["transfer"])
    assert config.outcomes.faithful.sum() == rec["n_faithful"] and config.ci_low == rec["ci_low"]
    assert search(tiny, finished).n_evaluated == 0


# --- a model folder whose config.json asks for absurd sizes ---------------------------------------------------
@pytest.fixture
def absurd_folder(tmp_path):
    from tests.circuits.test_reliability2 import absurd_model_folder

    return absurd_model_folder(tmp_path)


def test_a_model_folder_asking_for_absurd_sizes_is_refused_from_its_config(absurd_folder, tmp_path, capsys, monkeypatch):
    """`--model PATH`: refused in the checks before loading, naming config.json and its size fields; in the
    Python API and in a sweep (a failed cell), before any weight loads or any estimate is printed."""
    import time

    from circuits.models import loading
    from circuits.models.local import load_hooked

    loaded = []
    monkeypatch.setattr("circuits.models.local.load_hooked", lambda *a, **k: loaded.append(a) or load_hooked(*a, **k))
    expected = (f"{absurd_folder / 'config.json'} asks for at least", "n_layer=4096, n_embd=65536",
                "the config does not describe these weights")
    t0 = time.perf_counter()
    code = cli.main(["search", "--model", str(absurd_folder), "--task", "add", "--n-prompts", "10", "--no-progress",
                     "--out", str(tmp_path / "o")])
    assert time.perf_counter() - t0 < 10.0  # 0.7 s in a fresh process here; before: 46 s, after loading
    one_line_error(capsys, code, *expected)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="n_layer=4096, n_embd=65536"):
        loading.load_model(str(absurd_folder))
    code = cli.main(["sweep", "--models", str(absurd_folder), "--tasks", "add", "--n-prompts", "10", "--no-progress",
                     "--out", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert code == 2 and "TFLOP" not in captured.out and all(e in captured.err for e in expected), captured
    assert loaded == []


# --- af1 zoo train: the lock and the atomic writer ---------------------------------------------------------------
def test_zoo_train_holds_the_lock_and_writes_every_file_atomically(tmp_path, monkeypatch, capsys):
    import os

    from circuits.store.atomic import LinkError
    from circuits.store.lock import DirLock
    from circuits.zoo import train as zoo_train
    from circuits.zoo import trainer
    from tests.circuits.test_zoo_train import _tiny

    _tiny("arith-gpt2", monkeypatch)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    argv = ["zoo", "train", "tiny", "--out", str(out), "--ckpt", str(ckpt), "--model-class", "transformers"]
    for held in (out, ckpt):
        held.mkdir(exist_ok=True)
        with DirLock(held):
            one_line_error(capsys, cli.main(argv), "in use by another af1 command")
    assert not list(ckpt.rglob("*.safetensors")) and not list(out.iterdir())

    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: replaced.append(Path(dst)) or real_replace(src, dst))
    (ckpt / "phase1").mkdir(parents=True)
    leftover = ckpt / "phase1" / ".checkpoint.safetensors.x1y2.af1tmp"
    leftover.write_bytes(b"half a file")
    assert cli.main(argv) == 0
    written = [p for p in [*out.iterdir(), *ckpt.rglob("*")] if p.is_file()]
    assert written and all(p in replaced for p in written), sorted(set(written) - set(replaced))
    assert not leftover.exists() and not list(tmp_path.rglob("*.af1tmp"))

    # a checkpoint killed between its files is refused on resume, naming both
    state = json.loads((ckpt / "phase2" / "state.json").read_text())
    (ckpt / "phase2" / "state.json").write_text(json.dumps({**state, "step": state["step"] - 1, "stopped_early": False,
                                                            "finished": False}))
    with pytest.raises(CorruptRunError, match=r"checkpoint\.safetensors holds step .*state\.json step"):
        zoo_train.train("tiny", out_dir=out, ckpt_dir=ckpt, threads=1, progress=False, model_class="transformers")
    (ckpt / "phase2" / "state.json").write_text(json.dumps(state))

    # a link planted in the output folder is refused, and its target is untouched
    victim = tmp_path / "victim.md"
    victim.write_text("mine")
    (out / "card.md").unlink()
    (out / "card.md").symlink_to(victim)
    with pytest.raises(LinkError, match="card.md is a symbolic link"):
        zoo_train.train("tiny", out_dir=out, ckpt_dir=ckpt, threads=1, progress=False, model_class="transformers")
    assert victim.read_text() == "mine"
    assert trainer.checkpoint_step(ckpt / "phase2" / "checkpoint.safetensors") == state["step"]


# --- a rerun with nothing left to compute recomputes nothing -------------------------------------------------------
CHATTER = ("Moving model to device", "Loaded pretrained model", "Changing model dtype")


SEARCH = ["search", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "30", "--grid", "full",
          "--no-progress", "--out"]


def test_a_finished_search_rerun_checks_no_prompt_and_fits_no_means(tmp_path, counted, capfd):
    out = tmp_path / "s"
    assert cli.main([*SEARCH, str(out)]) == 0
    first = capfd.readouterr()
    assert counted["filter_correct"] and counted["draw_fit_set"] == 1 and counted["MeanCache.fit"] == 1
    summary = json.loads((out / files.SUMMARY).read_text())
    results_before = (out / files.SEARCH_RESULTS).read_bytes()
    for k in counted:
        counted[k] = 0
    assert cli.main([*SEARCH, str(out)]) == 0
    again = capfd.readouterr()
    assert counted == {"filter_correct": 0, "base_correct": 0, "draw_fit_set": 0, "MeanCache.fit": 0}
    assert f"reloaded from {out / files.PREPARED}" in again.out
    resumed = json.loads((out / files.SUMMARY).read_text())
    same = ("selected", "base_accuracy", "n_checked", "n_prompts", "smallest_transfer_per_wait", "identity", "fit")
    assert {k: resumed[k] for k in same} == {k: summary[k] for k in same}
    assert resumed["n_evaluated_this_run"] == 0 and resumed["n_resumed"] == 28
    assert (out / files.SEARCH_RESULTS).read_bytes() == results_before
    # TransformerLens's device and loading chatter appears on neither run
    for text in (first.out, first.err, again.out, again.err):
        assert not any(c in text for c in CHATTER), text


def test_prepared_prompts_are_reused_only_when_they_are_this_runs(tmp_path, counted, capsys):
    """A prepared file changed since it was recorded is prepared again (and the run resumes as before); one
    changed together with its recorded hash gives other prompts, which the run identity refuses."""
    from safetensors.torch import load as load_bytes
    from safetensors.torch import save

    from circuits.store.runs import file_sha256

    out = tmp_path / "s"
    assert cli.main([*SEARCH, str(out)]) == 0
    path = out / files.PREPARED
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n])["__metadata__"]
    tensors = load_bytes(data)
    tensors["tokens"] = tensors["tokens"].flip(0).contiguous()  # the same prompts in another order
    path.write_bytes(save(tensors, metadata=meta))
    for k in counted:
        counted[k] = 0
    capsys.readouterr()
    assert cli.main([*SEARCH, str(out)]) == 0  # not recorded: ignored, prepared again, the run resumes
    assert counted["filter_correct"] and counted["MeanCache.fit"] == 0
    assert path.read_bytes() == data
    path.write_bytes(save(tensors, metadata=meta))
    artifacts = json.loads((out / files.ARTIFACTS).read_text())
    (out / files.ARTIFACTS).write_text(json.dumps({**artifacts, files.PREPARED: file_sha256(path)}))
    capsys.readouterr()
    one_line_error(capsys, cli.main([*SEARCH, str(out)]), "prompts_sha256")


def test_a_task_or_prompts_file_changed_under_its_path_is_prepared_again(tmp_path, counted, capsys):
    """The prepared prompts' key holds the SHA-256 of the task file and of the prompt dataset: a file edited under
    the same path (here a comment only, which changes no field of the task) is not taken for the one the
    prompts were prepared from; an unchanged one is reloaded."""
    from circuits import zoo
    from circuits.prompts import prepared
    from circuits.prompts.spec import PromptSpec
    from circuits.tasks import package_data
    from datasets import Dataset

    task = tmp_path / "mine.toml"
    task.write_text((package_data.data_dir() / "tasks" / "add.toml").read_text())
    argv = [*SEARCH[:4], str(task), *SEARCH[5:], str(tmp_path / "s")]
    assert cli.main(argv) == 0
    for edit in ("", "# the same task, edited\n"):
        task.write_text(task.read_text() + edit)
        for k in counted:
            counted[k] = 0
        capsys.readouterr()
        assert cli.main(argv) == 0
        reloaded = "reloaded from" in capsys.readouterr().out
        assert reloaded == (edit == ""), edit
        assert (counted["filter_correct"] > 0) == (edit != "")

    model = zoo.load("arith-gpt2")
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "1+2=", "answer": 3}\n{"prompt": "2+2=", "answer": 4}\n')
    spec = PromptSpec(prompts=str(rows), n_prompts=2)
    before = prepared.spec_key(model, spec, None)
    assert prepared.spec_key(model, spec, None) == before
    rows.write_text('{"prompt": "1+2=", "answer": 3}\n{"prompt": "2+3=", "answer": 5}\n')
    after = prepared.spec_key(model, spec, None)
    assert after != before and after["spec"] == before["spec"]
    assert after["task"]["prompts"]["sha256"] != before["task"]["prompts"]["sha256"]
    one, two = (Dataset.from_dict({"prompt": ["1+2="], "answer": [a]}) for a in (3, 4))
    assert prepared.spec_key(model, PromptSpec(prompts=one, n_prompts=1), None) != \
        prepared.spec_key(model, PromptSpec(prompts=two, n_prompts=1), None)


def test_hooked_from_pretrained_chatter_is_silenced(monkeypatch, capfd, caplog):
    """TransformerLens 3.x's `from_pretrained` prints "Loaded pretrained model ..." and "Moving model to device"
    on stdout: the loader sends them to the circuits logger at DEBUG instead."""
    import logging

    from circuits.models import hub, loading
    from circuits.models import names as model_names
    from tests.conftest import has_hooked_transformer

    if not has_hooked_transformer():
        pytest.skip("TransformerLens 3.x only (HookedTransformer.from_pretrained)")
    import transformer_lens

    def from_pretrained(name, **kwargs):
        print("Moving model to device: ", "cpu")
        print(f"Loaded pretrained model {name} into HookedTransformer")
        return build_default("gpt2")

    monkeypatch.setattr(transformer_lens.HookedTransformer, "from_pretrained", staticmethod(from_pretrained))
    monkeypatch.setattr(model_names, "check_model_name", lambda *a, **k: None)
    monkeypatch.setattr(hub, "check_builtin_config", lambda name: None)
    with caplog.at_level(logging.DEBUG, logger="circuits"):
        loading.load_model("gpt2", backend="hooked")
    captured = capfd.readouterr()
    assert not any(c in captured.out + captured.err for c in CHATTER), captured
    assert any("Loaded pretrained model gpt2" in r.getMessage() for r in caplog.records)


# --- crafted inputs through the command line -------------------------------------------------------------------
def test_a_task_name_from_a_data_folder_that_would_leave_out_is_refused_by_af1_sweep(tmp_path, capsys, monkeypatch):
    """A `tasks.json` (the earlier one-file catalogue, which still loads) under AF1_DATASETS_DIR naming a task
    `../escape`: `af1 sweep` refuses it in one line before anything is written, and no folder appears outside
    --out."""
    from circuits.tasks import catalogue as tasks

    data = tmp_path / "data"
    data.mkdir()
    add = tasks.get_task("add")
    escape = {"name": "../escape", "template": add.template, "expression": add.expression,
              "operand_names": list(add.operand_names), "operand_ranges": [list(r) for r in add.operand_ranges],
              "answer_min": add.answer_min, "answer_max": add.answer_max, "default_n": add.default_n,
              "group": add.group, "style": add.style, "card": add.card}
    (data / "tasks.json").write_text(json.dumps({"version": 1, "tasks": [escape]}))
    monkeypatch.setenv("AF1_DATASETS_DIR", str(data))
    tasks._load_specs.cache_clear()
    try:
        work = tmp_path / "work"
        work.mkdir()
        out = work / "out"
        before = sorted(p.name for p in tmp_path.rglob("*"))
        code = cli.main(["sweep", "--models", "arith-gpt2", "--tasks", "../escape", "--ablations", "zero",
                         "--n-prompts", "10", "--no-progress", "--out", str(out)])
        one_line_error(capsys, code, "task '../escape' cannot name a folder")
        assert not out.exists() and sorted(p.name for p in tmp_path.rglob("*")) == before
        assert not (work / "escape").exists() and not (tmp_path / "escape").exists()
    finally:
        tasks._load_specs.cache_clear()


@pytest.fixture(scope="module")
def cli_search(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "s"
    assert cli.main([*SEARCH, str(out)]) == 0
    return out


CRAFTED = {
    "no n_prompts": (dict(drop="n_prompts"), "metadata n_prompts = None is not an integer"),
    "no z_mean": (dict(drop="z_mean"), "tensor(s) z_mean missing"),
    "pos_mean shape": (dict(change="pos_mean"), "tensor pos_mean has shape [2, 3]"),
    "cond_mean shape": (dict(change="cond_mean"), "tensor cond_mean has shape [1, 1, 1]"),
    "huge token id": (dict(change="entry_tok"), "entry_tok holds token ids outside"),
    "model_signature": (dict(meta={"model_signature": "{not json"}), "model_signature is missing or not JSON"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_means_file_resumed_by_the_command_is_one_line(cli_search, tmp_path, capsys, case):
    """An interrupted `af1 search` directory whose means.safetensors was replaced by a crafted one (and its hash
    recorded in artifacts.json, so that it is read): the resume stops with exit 2 and one line naming the file."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from circuits.store.runs import file_sha256
    from tests.circuits.test_reliability2 import crafted

    out = tmp_path / "s"
    shutil.copytree(cli_search, out)
    lines = (out / files.SEARCH_RESULTS).read_text().splitlines(keepends=True)
    (out / files.SEARCH_RESULTS).write_text("".join(lines[:10]))  # interrupted after 10 configurations
    (out / files.SUMMARY).unlink()
    how, expected = CRAFTED[case]
    if "change" in how:
        original = load_file(str(out / files.MEANS))
        value = {"pos_mean": torch.zeros(2, 3), "cond_mean": torch.zeros(1, 1, 1)}.get(how["change"])
        if how["change"] == "entry_tok":
            value = original["entry_tok"].clone()
            value[0] = 2**40
        how = dict(change={how["change"]: value})
    made = crafted(out / files.MEANS, tmp_path / "crafted.safetensors", **how)
    shutil.move(made, out / files.MEANS)
    artifacts = json.loads((out / files.ARTIFACTS).read_text())
    (out / files.ARTIFACTS).write_text(json.dumps({**artifacts, files.MEANS: file_sha256(out / files.MEANS)}))
    before = (out / files.SEARCH_RESULTS).read_bytes()
    capsys.readouterr()
    one_line_error(capsys, cli.main([*SEARCH, str(out)]), str(out / files.MEANS), expected)
    assert (out / files.SEARCH_RESULTS).read_bytes() == before and not (out / files.SUMMARY).exists()
