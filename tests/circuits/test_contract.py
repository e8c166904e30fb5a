"""The analysis contract (:mod:`circuits.analyses`): an analysis defined here, in the test module, and registered
with one call runs through the runner (``execute``, ``run_analysis``) and as a sweep cell without a change to
the runner, the sweep, loading or the zoo; and the entry points take ``config=`` as well as their old keywords."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from circuits import analyses
from circuits.analyses import Analysis, RunContext
from circuits.errors import ArgumentError
from circuits.models.spec import ModelSpec
from circuits.prompts.spec import PromptSpec
from circuits.runner import execute, run_analysis
from circuits.store import files
from circuits.store.runs import RunDir, tokens_sha256
from circuits.sweep import SweepConfig, run_sweep


# --- a new analysis: the mean probability of the answer, one record per prompt -----------------------------
@dataclass(frozen=True)
class AnswerProbConfig:
    batch_size: int = 128
    seed: int = 0

    def validate(self, info: Any = None) -> AnswerProbConfig:
        if self.batch_size < 1:
            raise ArgumentError(f"batch_size={self.batch_size} must be >= 1")
        return self


@dataclass
class AnswerProb:
    probs: list[float]
    n_resumed: int

    @property
    def mean(self) -> float:
        return sum(self.probs) / len(self.probs)


def answer_prob_run(model: Any, config: AnswerProbConfig, ctx: RunContext) -> AnswerProb:
    done = {r["index"]: r["prob"] for r in ctx.store.records()}
    n_resumed = len(done)
    probs = []
    for i in range(len(ctx.tokens)):
        if i not in done:
            with torch.no_grad():
                logits = model(ctx.tokens[i : i + 1])[0, -1]
            done[i] = float(logits.softmax(-1)[int(ctx.answers[i])])
            ctx.store.append({"index": i, "prob": done[i]})
        probs.append(done[i])
    return AnswerProb(probs, n_resumed=n_resumed)


def answer_prob_identity(config: AnswerProbConfig, ctx: RunContext, model: Any) -> dict[str, Any]:
    return {"analysis": "answer_prob", "prompts_sha256": tokens_sha256(ctx.tokens, ctx.answers),
            **{k: v for k, v in ctx.meta.items() if k in ("model", "task")}}


def answer_prob_write(result: AnswerProb, run_dir: RunDir, ctx: RunContext) -> None:
    run_dir.write_json(files.SUMMARY, {"mean": result.mean, "n": len(result.probs)})


ANSWER_PROB: Analysis[AnswerProbConfig, AnswerProb] = Analysis(
    name="answer_prob", config_type=AnswerProbConfig, results_file="answer_prob.jsonl",
    identity=answer_prob_identity, run=answer_prob_run, write=answer_prob_write,
    summary_row=lambda result: {"faithfulness": result.mean},
)


@pytest.fixture(scope="module")
def registered():
    analyses.register(ANSWER_PROB)
    yield ANSWER_PROB
    analyses.unregister("answer_prob")
    assert "answer_prob" not in analyses.names()


@pytest.fixture(scope="module")
def zoo_model():
    return ModelSpec("arith-gpt2").load()


def expected_mean(model: Any, tokens: torch.Tensor, answers: torch.Tensor) -> float:
    """The mean answer probability over the prompts the model answers correctly, in one batch."""
    with torch.no_grad():
        logits = model(tokens)[:, -1]
    keep = logits.argmax(-1) == answers
    return float(logits.softmax(-1)[torch.arange(len(answers)), answers][keep].mean())


def test_a_registered_analysis_runs_through_execute_and_resumes(registered, zoo_model, tmp_path):
    prompts = PromptSpec("add", n_prompts=12, seed=3).prepare(zoo_model, progress=False)
    out = tmp_path / "run"
    result = execute(registered, zoo_model, prompts.tokens, prompts.answers, AnswerProbConfig(), out_dir=out,
                     meta={"model": "arith-gpt2", "task": "add"}, progress=False)
    assert result.mean == pytest.approx(expected_mean(zoo_model, prompts.tokens, prompts.answers), abs=1e-5)
    records = [json.loads(line) for line in (out / "answer_prob.jsonl").read_text().splitlines()]
    assert len(records) == len(result.probs) and json.loads((out / files.SUMMARY).read_text())["n"] == len(records)
    assert json.loads((out / files.IDENTITY).read_text())["analysis"] == "answer_prob"
    # A rerun reads every record back instead of computing it (no single-prompt forward pass).
    single = []
    hook = zoo_model.register_forward_pre_hook(lambda module, args: single.append(bool(args) and args[0].shape[0] == 1))
    try:
        again = execute(registered, zoo_model, prompts.tokens, prompts.answers, AnswerProbConfig(), out_dir=out,
                        meta={"model": "arith-gpt2", "task": "add"}, progress=False)
    finally:
        hook.remove()
    assert again.probs == result.probs and again.n_resumed == len(records) and not any(single)
    # From specs: the runner loads, prepares the prompts and records what it ran.
    spec_run = run_analysis(registered, ModelSpec("arith-gpt2"), PromptSpec("add", n_prompts=12, seed=3),
                            AnswerProbConfig(batch_size=4), out=tmp_path / "specs", progress=False)
    assert spec_run.probs == pytest.approx(result.probs, abs=1e-6)
    assert json.loads((tmp_path / "specs" / files.IDENTITY).read_text())["task"] == "add"


def test_the_command_line_is_the_one_entry_point_run(tmp_path, capsys):
    """`af1 search` is `run(SEARCH, config, ModelSpec, PromptSpec, RunOptions)`: a directory written by `run` from
    Python is the command's own (the command resumes every configuration and evaluates none), and the configs' own
    fields carry the flags (the same SearchConfig either way)."""
    from circuits import cli
    from circuits.options import RunOptions
    from circuits.runner import run
    from circuits.search.analysis import SEARCH
    from circuits.search.config import SearchConfig

    out = tmp_path / "s"
    config = SearchConfig(grid="full", ablation="zero", seed=2)  # --seed sets the prompts' and the bootstrap's
    first = run(SEARCH, config, ModelSpec("arith-gpt2"), PromptSpec("add", n_prompts=15, seed=2),
                RunOptions(out=out, progress=False))
    capsys.readouterr()
    argv = ["search", "--model", "arith-gpt2", "--task", "add", "--n-prompts", "15", "--seed", "2", "--grid", "full",
            "--ablation", "zero", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"resumed {len(first.results)} configuration(s)" in printed
    from circuits.commands.search import spec

    assert spec(cli.build_parser().parse_args(argv)).config == config


def test_a_registered_analysis_runs_as_a_sweep_cell(registered, zoo_model, tmp_path):
    config = SweepConfig.from_mapping({"models": ["arith-gpt2"], "tasks": ["add"], "ablations": ["zero"],
                                       "mode": "fixed", "wait": 1, "transfer": 1, "n_prompts": 12,
                                       "analyses": ["answer_prob"]})
    rows = run_sweep(config, tmp_path / "sweep", progress=False)
    row = next(r for r in rows if r.ablation == "answer_prob")
    assert row.status == "ok", row.error
    prompts = PromptSpec("add", n_prompts=12, seed=0).prepare(zoo_model, progress=False)
    assert row.faithfulness == pytest.approx(expected_mean(zoo_model, prompts.tokens, prompts.answers), abs=1e-5)
    assert row.n_prompts == 12 and (tmp_path / "sweep" / row.path / "answer_prob.jsonl").is_file()
    fixed = next(r for r in rows if r.ablation == "zero")
    assert fixed.status == "ok" and (fixed.wait, fixed.transfer) == (1, 1)


def test_a_sweep_refuses_an_unknown_analysis():
    with pytest.raises(ArgumentError, match="'nope' is not an analysis"):
        SweepConfig.from_mapping({"models": ["arith-gpt2"], "tasks": ["add"], "analyses": ["nope"]})


# --- config= beside the old keywords ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from dataclasses import replace

    from circuits.prompts.fitset import FitSet
    from circuits.prompts.sampling import self_answer_prompts
    from tests.conftest import build_default, disjoint_fit_tokens, random_tokens

    model = build_default("gpt2")
    tokens = random_tokens(30, 6, seed=4, values=5)
    prompts = self_answer_prompts(model, tokens, task="random")
    return model, replace(prompts, fit=FitSet.given(disjoint_fit_tokens(tokens)))


def test_entry_points_take_a_config_or_the_old_keywords(tiny):
    from circuits.necessity import NecessityConfig, necessity_sweep
    from circuits.prune import PruneConfig, prune_heads
    from circuits.search import SearchConfig, search_af1

    model, p = tiny
    kw = dict(fit=p.fit, progress=False)
    old = search_af1(model, p.tokens, p.answers, grid="full", ablation="mean", n_boot=10, seed=2, **kw)
    new = search_af1(model, p.tokens, p.answers, config=SearchConfig(grid="full", ablation="mean", n_boot=10, seed=2),
                     **kw)
    assert [(r.config, r.faithfulness, r.ci_low) for r in new.results] == \
           [(r.config, r.faithfulness, r.ci_low) for r in old.results] and len(new.results) == 15
    # a keyword overrides the config's field
    zero = search_af1(model, p.tokens, p.answers, config=SearchConfig(grid="full", n_boot=10), ablation="zero", **kw)
    assert zero.ablation == "zero"
    with pytest.raises(ArgumentError, match="is not a SearchConfig"):
        search_af1(model, p.tokens, p.answers, config=NecessityConfig(), **kw)
    blocks = necessity_sweep(model, p.tokens, p.answers, config=NecessityConfig(layers=(1, 2), n_boot=10),
                             progress=False)
    assert [b.layer for b in blocks.blocks] == [1, 2]
    a = prune_heads(model, p.tokens, p.answers, wait=0, transfer=1, ablation="zero", rank="none", n_boot=10,
                    progress=False)
    b = prune_heads(model, p.tokens, p.answers, config=PruneConfig(0, 1, ablation="zero", rank="none", n_boot=10),
                    progress=False)
    assert [(c.step, c.faithfulness) for c in a.curve] == [(c.step, c.faithfulness) for c in b.curve]
    with pytest.raises(ArgumentError, match="wait= and transfer="):
        prune_heads(model, p.tokens, p.answers, ablation="zero", progress=False)
