"""Necessity sweep: per-block faithfulness equals an independent score-masking computation."""

from __future__ import annotations

import json

import pytest
import torch

from circuits.necessity import necessity_sweep
from circuits.store.runs import RunMismatchError
from tests.conftest import build_default, random_tokens


def masked_scores_correct(model, tokens, answers, layer):
    """Independent reference: -inf on the pre-softmax scores of the last query row, except BOS and self."""

    def hook(scores, hook=None):
        scores = scores.clone()
        scores[:, :, -1, 1:-1] = float("-inf")
        return scores

    with torch.inference_mode():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_attn_scores", hook)])
    return (logits[:, -1].argmax(-1) == answers).sum().item()


def test_necessity_matches_score_masking(model):
    tokens = random_tokens(40, 6, seed=11, values=6)
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    result = necessity_sweep(model, tokens, answers, progress=False, n_boot=20)
    assert [b.layer for b in result.blocks] == [0, 1, 2, 3]
    for b in result.blocks:
        assert b.n == 40
        assert b.n_faithful == masked_scores_correct(model, tokens, answers, b.layer)
        assert b.faithfulness == pytest.approx(b.n_faithful / 40)
    assert any(b.n_faithful < 40 for b in result.blocks)  # the cut matters somewhere in a random model


def test_necessity_outputs_and_resume(tmp_path):
    model = build_default("gpt2")
    tokens = random_tokens(24, 6, seed=2, values=6)
    with torch.inference_mode():
        answers = model(tokens)[:, -1].argmax(-1)
    out = tmp_path / "nec"
    meta = {"model": "tiny", "task": "random"}
    first = necessity_sweep(model, tokens, answers, out_dir=out, progress=False, n_boot=20, meta=meta)
    lines = (out / "necessity.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 4
    (out / "necessity.jsonl").write_text("".join(lines[:2]) + lines[2][:7])
    again = necessity_sweep(model, tokens, answers, out_dir=out, progress=False, n_boot=20, meta=meta)
    assert again.n_resumed == 2
    assert [b.to_dict() for b in again.blocks] == [b.to_dict() for b in first.blocks]
    summary = json.loads((out / "necessity.json").read_text())
    assert [b["layer"] for b in summary["blocks"]] == [0, 1, 2, 3] and summary["model"] == "tiny"
    html = (out / "report.html").read_text()
    assert '"type":"bar"' in html and f"{first.blocks[0].faithfulness:.2f}" in html
    with pytest.raises(RunMismatchError, match="task: 'random' -> 'other'"):
        necessity_sweep(model, tokens, answers, out_dir=out, progress=False, meta={**meta, "task": "other"})


def test_necessity_bad_layer():
    model = build_default("gpt2")
    tokens = random_tokens(4, 5, seed=0)
    with pytest.raises(ValueError, match="out of range"):
        necessity_sweep(model, tokens, torch.zeros(4, dtype=torch.long), layers=[7], progress=False)
