"""Reopening an older or edited run directory (``circuits.results.load``): every field read back from
``run.json`` and ``summary.json`` is checked, and a missing or malformed one is one line naming the file and the
field (docs/reliability.md, "Models, run directories and signals")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from circuits import results
from circuits.errors import CorruptRunError
from circuits.store import files
from tests.circuits.test_reliability2 import finished, tiny  # noqa: F401, F811 - fixtures


def edit(path: Path, drop: tuple[str, ...] = (), **change: object) -> None:
    doc = json.loads(path.read_text())
    for name in drop:
        doc.pop(name, None)
    doc.update(change)
    path.write_text(json.dumps(doc))


def test_an_unedited_search_reopens_with_its_blocks(finished):  # noqa: F811
    r = results.load(finished)
    identity = json.loads((finished / files.IDENTITY).read_text())
    assert r.n_layers == identity["model_signature"]["n_layers"] == json.loads(
        (finished / files.SUMMARY).read_text())["n_layers"]
    assert r.grid_array().shape == (r.n_layers + 1, r.n_layers + 1)


EDITS = {
    # a 101x101 grid for a model of a few blocks was accepted
    "n_layers contradicts run.json": (files.SUMMARY, (), {"n_layers": 100},
                                      "summary.json: field 'n_layers' = 100 contradicts"),
    "n_layers not an integer": (files.SUMMARY, (), {"n_layers": "6"}, "summary.json: field 'n_layers' = '6' is not"),
    "no model_signature anywhere": (files.IDENTITY, ("model_signature",), {}, "run.json: field 'model_signature' "
                                                                              "is missing"),
    "model_signature not an object": (files.IDENTITY, (), {"model_signature": "gpt2"},
                                      "run.json: field 'model_signature' = 'gpt2' is not an object"),
    "base_accuracy not a number": (files.SUMMARY, (), {"base_accuracy": "high"},
                                   "summary.json: field 'base_accuracy' = 'high' is not a number"),
    "threshold out of range": (files.SUMMARY, (), {"threshold": 1.5},
                               "summary.json: field 'threshold' = 1.5 is not a fraction in [0, 1]"),
    "threshold a string": (files.SUMMARY, (), {"threshold": "0.9"}, "summary.json: field 'threshold' = '0.9'"),
    "passes negative": (files.SUMMARY, (), {"passes": -3}, "summary.json: field 'passes' = -3 is below 0"),
}


@pytest.mark.parametrize("case", EDITS)
def test_an_edited_search_directory_is_one_line_naming_the_file_and_field(finished, case):  # noqa: F811
    name, drop, change, said = EDITS[case]
    if case == "no model_signature anywhere":
        edit(finished / files.SUMMARY, drop=("n_layers",))
    edit(finished / name, drop=drop, **change)
    with pytest.raises(CorruptRunError) as caught:
        results.load(finished)
    message = str(caught.value)
    assert said in message and str(finished) in message and "\n" not in message, message


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> Path:
    """A finished pruning run directory (the tiny Llama stand-in, as ``tests/circuits/test_prune.py``)."""
    import torch

    from circuits.prune import prune_heads
    from tests.circuits.test_prune import setup
    from tests.conftest import build_default

    torch.manual_seed(0)
    model = build_default("llama")
    tokens, cache, answers = setup(model)
    out = tmp_path_factory.mktemp("prune") / "run"
    prune_heads(model, tokens, answers, wait=0, transfer=2, cache=cache, progress=False, batch_size=64,
                meta={"model": "tiny-llama"}, out_dir=out)
    return out


PRUNE_EDITS = {
    "wait missing": (files.IDENTITY, ("wait",), {}, "run.json: field 'wait' is missing"),
    "rank unknown": (files.IDENTITY, (), {"rank": "best"}, "run.json: field 'rank' = 'best' is not one of"),
    "model not an object": (files.IDENTITY, (), {"model": 3}, "run.json: field 'model' = 3 is not an object"),
    "target out of range": (files.SUMMARY, (), {"target": 7}, "summary.json: field 'target' = 7 is not a fraction"),
    "auc not a number": (files.SUMMARY, (), {"auc": "high"}, "summary.json: field 'auc' = 'high' is not a number"),
}


@pytest.mark.parametrize("case", PRUNE_EDITS)
def test_an_edited_pruning_directory_is_one_line_naming_the_file_and_field(pruned, tmp_path, case):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(pruned, run)
    assert results.load(run).config.wait == 0
    name, drop, change, said = PRUNE_EDITS[case]
    edit(run / name, drop=drop, **change)
    with pytest.raises(CorruptRunError) as caught:
        results.load(run)
    assert said in str(caught.value) and "\n" not in str(caught.value), caught.value


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A finished one-cell sweep of the zoo model (zero ablation: no means to fit)."""
    from circuits import cli

    out = tmp_path_factory.mktemp("sweep") / "out"
    assert cli.main(["sweep", "--models", "arith-gpt2", "--tasks", "add", "--ablations", "zero", "--n-prompts", "8",
                     "--no-progress", "--out", str(out)]) == 0
    return out


SWEEP_EDITS = {
    "no config": ((("config",)), {}, "summary.json: field 'config' is missing"),
    "config not an object": ((), {"config": []}, "summary.json: field 'config' = [] is not an object"),
    "cells not a list": ((), {"cells": {"a": 1}}, "summary.json: field 'cells' is not a list of objects"),
    "seconds not a number": ((), {"seconds": "long"}, "summary.json: field 'seconds' = 'long' is not a number"),
}


@pytest.mark.parametrize("case", SWEEP_EDITS)
def test_an_edited_sweep_summary_is_one_line_naming_the_file_and_field(swept, tmp_path, case):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(swept, run)
    assert len(results.load(run).cells) == 1
    drop, change, said = SWEEP_EDITS[case]
    edit(run / files.SUMMARY, drop=drop, **change)
    with pytest.raises(CorruptRunError) as caught:
        results.load(run)
    assert said in str(caught.value) and "\n" not in str(caught.value), caught.value
