"""Continuing a ground truth's recipe (``af1 zoo train NAME --continue-from FOLDER``) into a folder already in
use: the folder continued from, or another model's folder, is refused in one line before anything is loaded or
written, and stays as it was (docs/reliability.md, "Models, run directories and signals")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from circuits import cli, zoo
from tests.circuits.test_reliability2 import one_line_error, snapshot
from tests.conftest import needs_hooked

NAME = "arith-gpt2-gt-w2t2"


def first_phases(tmp_path: Path) -> Path:
    """A copy of the shipped ground truth whose card says it was trained with all but the last phase (what
    ``--continue-from`` continues: only the last phase would run)."""
    if NAME not in zoo.available():
        pytest.skip(f"{NAME} is not shipped")
    folder = tmp_path / "first-phases"
    shutil.copytree(zoo.model_dir(NAME), folder)
    card = json.loads((folder / "card.json").read_text())
    card["phases"] = card["phases"][:-1]
    card["groundtruth_train"]["phases"] = card["groundtruth_train"]["phases"][:-1]
    (folder / "card.json").write_text(json.dumps(card))
    return folder


@needs_hooked
@pytest.mark.parametrize("into", ["the folder continued from", "another model's folder"])
def test_continuing_into_a_used_folder_is_refused_and_changes_nothing(into, tmp_path, capsys):
    source = first_phases(tmp_path)
    if into == "the folder continued from":
        out, said = source, "is the folder --continue-from reads: the continued model would replace the one"
    else:
        out = tmp_path / "arith-gpt2"
        shutil.copytree(zoo.model_dir("arith-gpt2"), out)
        said = "holds the model 'arith-gpt2' (card.json): training arith-gpt2-gt-w2t2 there would replace it"
    before, kept = snapshot(out), snapshot(source)
    code = cli.main(["zoo", "train", NAME, "--continue-from", str(source), "--out", str(out), "--ckpt",
                     str(tmp_path / "ckpt"), "--steps", "1", "--eval-every", "1"])
    one_line_error(capsys, code, said)
    assert snapshot(out) == before and snapshot(source) == kept and not (tmp_path / "ckpt").exists()
