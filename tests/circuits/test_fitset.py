"""The means' fit set: drawn from the task, disjoint from the scored prompts, counted and enforced.

Checked against independent computations: the fit set against an enumeration of the task's operand space,
the counts against counting the fit tokens by hand, and CAMA's replacement against means built with a
dictionary from the fit prompts' own activations.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import interventions as iv
from circuits import cli
from circuits.errors import FitSetError
from circuits.faithfulness import base_correct
from circuits.prompts.fitset import FitSet, FitSpec, draw_fit_set
from circuits.prompts.spec import PromptSpec, fit_covered
from circuits.search import search_af1
from circuits.tasks import catalogue as tasks
from interventions.coverage import row_digests


@pytest.fixture(scope="module")
def zoo_model():
    from circuits import zoo

    return zoo.load("arith-gpt2")


@pytest.fixture(scope="module")
def add_prompts(zoo_model):
    return PromptSpec("add", n_prompts=200).prepare(zoo_model, means="cama", progress=False)


def test_the_whole_layout_without_the_scored_prompts(zoo_model, add_prompts):
    """``add`` has 10000 prompts (A, B in 0..99), every one of them 5 tokens on the zoo tokenizer: the fit set
    is all of them but the 200 scored ones."""
    fit = add_prompts.fit
    every = {tuple(zoo_model.to_tokens(f"{a}+{b}=")[0].tolist()) for a in range(100) for b in range(100)}
    scored = {tuple(r) for r in add_prompts.tokens.tolist()}
    assert len(every) == 10_000 and scored <= every
    assert {tuple(r) for r in fit.tokens.tolist()} == every - scored
    assert len(fit) == 9_800 and fit.whole and fit.task == "add" and add_prompts.n_dropped_fit == 0


def test_a_sample_covers_every_needed_entry(zoo_model):
    """``add_add`` has a million prompts: a sample of ``size``, topped up until every entry the scored prompts
    read has ``min_count`` fit prompts (counted here by hand)."""
    p = PromptSpec("add_add", n_prompts=60).prepare(zoo_model, means=None, progress=False)
    fit = draw_fit_set(zoo_model, "add_add", p.tokens, FitSpec(size=300, min_count=6, seed=3))
    counts = Counter((t, tok) for row in fit.tokens.tolist() for t, tok in enumerate(row) if t >= 1)
    needed = {(t, tok) for row in p.tokens.tolist() for t, tok in enumerate(row) if t >= 1}
    assert not fit.whole and len(fit) > 300 and fit.n_drawn < tasks.operand_space_size("add_add")
    assert min(counts[e] for e in needed) >= 6
    assert not bool(torch.isin(row_digests(fit.tokens), row_digests(p.tokens)).any())
    again = draw_fit_set(zoo_model, "add_add", p.tokens, FitSpec(size=300, min_count=6, seed=3))
    assert torch.equal(again.tokens, fit.tokens)  # deterministic in the seed
    assert not torch.equal(draw_fit_set(zoo_model, "add_add", p.tokens, FitSpec(size=300, min_count=6, seed=4)).tokens[:50],
                           fit.tokens[:50])


def test_population_correct_keeps_only_answered_prompts(zoo_model):
    p = PromptSpec("add_add", n_prompts=40).prepare(zoo_model, means=None, progress=False)
    fit = draw_fit_set(zoo_model, "add_add", p.tokens, FitSpec(size=500, min_count=1, population="correct"))
    rows = fit.tokens.tolist()
    prompts = [tasks.get_task("add_add").prompt([int(zoo_model.tokenizer.decode([r[i]])) for i in (1, 3, 5)])
               for r in rows]
    values = [tasks.get_task("add_add").answer([int(zoo_model.tokenizer.decode([r[i]])) for i in (1, 3, 5)])
              for r in rows]
    answers = tasks.answer_token_ids(zoo_model, values)
    assert all(zoo_model.to_tokens(q)[0].tolist() == r for q, r in zip(prompts[:20], rows[:20]))
    assert bool(base_correct(zoo_model, fit.tokens, answers).all())


def test_an_entry_seen_once_among_the_scored_prompts_is_still_ablated(zoo_model, add_prompts):
    """The issue's case: with means fitted on the scored prompts, a second operand held by one scored prompt
    was replaced by that prompt's own activation (no ablation). From the fit set it is the mean over the
    other task prompts holding it, built here from their activations with a dictionary."""
    tokens, fit = add_prompts.tokens, add_prompts.fit
    seen = Counter(tokens[:, 3].tolist())
    once = next(i for i, row in enumerate(tokens.tolist()) if seen[row[3]] == 1)
    layer = 1
    result = search_af1(zoo_model, tokens, add_prompts.answers, fit=fit, grid="auto", progress=False, n_boot=10)
    assert result.n_prompts == 200
    cache = iv.MeanCache.fit(zoo_model, fit.tokens, progress=False)
    got = {}

    def keep(x, hook):
        got["x"] = x[0, 3].clone()

    with iv.apply(zoo_model, [iv.CAMA(cache, layer=layer)]):
        zoo_model.run_with_hooks(tokens[once : once + 1], fwd_hooks=[(f"blocks.{layer + 1}.hook_resid_pre", keep)])
    _, own = zoo_model.run_with_cache(tokens[once : once + 1], names_filter=f"blocks.{layer}.hook_resid_post")
    holders = fit.tokens[fit.tokens[:, 3] == tokens[once, 3]]
    _, acts = zoo_model.run_with_cache(holders, names_filter=f"blocks.{layer}.hook_resid_post")
    by_hand = acts[f"blocks.{layer}.hook_resid_post"][:, 3].double().mean(0).float()
    assert len(holders) == 99  # every other task prompt with this second operand (A in 0..99)
    torch.testing.assert_close(got["x"], by_hand, atol=1e-5, rtol=1e-5)
    assert float((got["x"] - own[f"blocks.{layer}.hook_resid_post"][0, 3]).detach().abs().max()) > 1e-2


def test_counts_in_cache_and_summary_equal_counting_by_hand(zoo_model, add_prompts, tmp_path):
    out = tmp_path / "s"
    search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, fit=add_prompts.fit, grid="auto",
               out_dir=out, progress=False, n_boot=10, meta={"model": "arith-gpt2", "task": "add"})
    cache = iv.MeanCache.load(out / "means.safetensors")
    fit_rows = add_prompts.fit.tokens.tolist()
    by_hand = Counter((t, tok) for row in fit_rows for t, tok in enumerate(row))
    counts = cache.counts(add_prompts.tokens)
    for row, c in zip(add_prompts.tokens.tolist()[:30], counts.tolist()[:30]):
        assert c[1:] == [by_hand[(t, tok)] for t, tok in enumerate(row) if t >= 1]
    needed = {(t, tok) for row in add_prompts.tokens.tolist() for t, tok in enumerate(row) if t >= 1}
    values = sorted(by_hand[e] for e in needed)
    cov = json.loads((out / "summary.json").read_text())["fit"]["coverage"]
    assert cov["min"] == values[0] and cov["n_entries"] == len(needed) and cov["n_under"] == 0
    assert cov["median"] == pytest.approx(float(torch.tensor(values, dtype=torch.float64).median()) if len(values) % 2
                                          else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2)
    assert "Means: 9800 fit prompts (the whole layout of task add" in (out / "report.html").read_text()
    ident = json.loads((out / "run.json").read_text())["means"]
    assert ident["fit"] == {**FitSpec().identity(), "task": "add", "whole": True, "n_fit": 9800,
                            "sha256": add_prompts.fit.sha256}


def test_a_scored_prompt_in_the_fit_set_is_refused(zoo_model, add_prompts):
    cache = iv.MeanCache.fit(zoo_model, add_prompts.tokens, progress=False)
    with pytest.raises(FitSetError, match=r"200 scored prompt\(s\) are in the MeanCache's fit set"):
        search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, cache=cache, progress=False)
    with pytest.raises(FitSetError, match="needs means .* fitted on prompts other than the ones it scores"):
        search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, progress=False)
    # given fit tokens that overlap the scored prompts: the overlap is removed, never used
    both = torch.cat([add_prompts.tokens[:50], add_prompts.fit.tokens])
    r = search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, fit_tokens=both, grid="auto", progress=False,
                   n_boot=10)
    ref = search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, fit=add_prompts.fit, grid="auto",
                     progress=False, n_boot=10)
    assert [x.n_faithful for x in r.results] == [x.n_faithful for x in ref.results]


def test_an_entry_under_the_minimum_is_refused_naming_its_token(zoo_model, add_prompts):
    few = add_prompts.fit.tokens[:300]
    with pytest.raises(FitSetError, match=r"fewer than 5 fit prompts \('\d+' \(id \d+\) at position [13]: [0-4]"
                                          r".*fit the means on more prompts of the task, or lower the minimum explicitly \(--fit-min-count"):
        search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, fit_tokens=few, progress=False)
    counts = iv.MeanCache.fit(zoo_model, few, progress=False).counts(add_prompts.tokens)[:, 1:]
    keep = (counts >= 1).all(dim=1)
    r = search_af1(zoo_model, add_prompts.tokens[keep], add_prompts.answers[keep], fit_tokens=few, min_count=1,
                   grid="auto", progress=False, n_boot=10)
    assert r.n_prompts == int(keep.sum())


def test_prepare_sets_aside_prompts_whose_means_are_thin(zoo_model):
    """``sub`` (A >= B): a second operand B is held by 100 - B prompts, so with min_count 30 every scored
    prompt with B > 70 reads a thin mean: set aside and replaced."""
    p = PromptSpec("sub", n_prompts=100, fit=FitSpec(min_count=30)).prepare(zoo_model, means="cama", progress=False)
    b = [int(zoo_model.tokenizer.decode([t])) for t in p.tokens[:, 3].tolist()]
    assert len(p) == 100 and max(b) <= 70 and p.n_dropped_fit > 0
    assert bool(fit_covered(p.fit, p.tokens).all())
    plain = PromptSpec("sub", n_prompts=100, fit=FitSpec(min_count=30)).prepare(zoo_model, means="mean",
                                                                                  progress=False)
    assert plain.n_dropped_fit == 0  # plain means average over every fit prompt


def test_cli_fit_flags_identity_and_refusals(tmp_path, capsys):
    out = tmp_path / "s"
    argv = ["search", "--model", "arith-gpt2", "--task", "add_sub", "--n-prompts", "40", "--no-progress",
            "--fit-size", "400", "--out", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "means: fit set of up to 400 prompts (a sample of the 833350 task prompts)" in printed
    assert "means: fitted on" in printed and "none of them scored" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fit"]["fit"]["size"] == 400 and summary["fit"]["coverage"]["min"] >= 5
    assert cli.main([*argv[:-1], str(out), "--fit-seed", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "means.fit.seed: 0 -> 1" in err[0] and "new --out" in err[0]
    assert cli.main(argv) == 0 and "resumed" in capsys.readouterr().out
    assert cli.main([*argv[:-1], str(tmp_path / "bad"), "--fit-size", "0"]) == 2
    assert "fit size=0 must be an integer >= 1 (--fit-size)" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_fit_set_identity_is_its_content(zoo_model, add_prompts):
    fit = add_prompts.fit
    assert FitSet.given(fit.tokens).sha256 == fit.sha256
    assert FitSet.given(fit.tokens[1:]).sha256 != fit.sha256
    assert fit.without(fit.tokens[:10]).tokens.shape[0] == len(fit) - 10


def test_cache_contains_and_old_files(zoo_model, add_prompts, tmp_path):
    cache = iv.MeanCache.fit(zoo_model, add_prompts.fit.tokens[:500], progress=False)
    assert cache.contains(add_prompts.fit.tokens[:3]).tolist() == [True] * 3
    assert not bool(cache.contains(add_prompts.tokens).any())
    path = cache.save(tmp_path / "m.safetensors")
    assert iv.MeanCache.load(path).contains(add_prompts.fit.tokens[:2]).all()
    old = iv.MeanCache(**{k: v for k, v in cache.tensors().items() if k != "fit_rows"}, n_prompts=500,
                       model_signature=cache.model_signature)
    with pytest.raises(iv.CacheMismatchError, match="does not record which prompts it was fitted on"):
        old.contains(add_prompts.tokens)
    with pytest.raises(iv.CacheMismatchError, match="does not record"):
        search_af1(zoo_model, add_prompts.tokens, add_prompts.answers, cache=old, progress=False)


def test_cama_on_a_prompt_the_cache_lacks_names_its_token_and_extends(zoo_model):
    """``7+8-9=`` against means fitted on first operands 0..6: the error names ``'7'`` as the tokenizer spells
    it; extending the cache with first operand 7 makes CAMA run with the means of a fit on both sets."""
    prompt = zoo_model.to_tokens("7+8-9=")
    seven = int(prompt[0, 1])
    texts = lambda firsts: [f"{a}+{b}-{c}=" for a in firsts for b in range(10) for c in range(10)]  # noqa: E731
    some, rest = zoo_model.to_tokens(texts(range(7))), zoo_model.to_tokens(texts([7]))
    cache = iv.MeanCache.fit(zoo_model, some, progress=False)
    assert not cache.covers(prompt).any()
    assert [(e.position, e.token, e.count) for e in cache.coverage(prompt).missing] == [(1, seven, 0)]
    with pytest.raises(iv.CacheMismatchError, match=rf"no mean for '7' \(id {seven}\) at position 1 \(prompt 0 of "
                                                     rf"the batch\).*cache = cache.extend\(model, more_fit_tokens\)"):
        iv.run(zoo_model, prompt, [iv.CAMA(cache, layer=2)])
    grown = cache.extend(zoo_model, rest, progress=False)
    assert grown.covers(prompt).all() and grown.count(1, seven) == 100
    both = iv.MeanCache.fit(zoo_model, torch.cat([some, rest]), progress=False)
    torch.testing.assert_close(iv.run(zoo_model, prompt, [iv.CAMA(grown, layer=2)]),
                               iv.run(zoo_model, prompt, [iv.CAMA(both, layer=2)]), atol=1e-4, rtol=1e-4)


def test_the_api_draws_a_fit_spec_for_the_named_task(zoo_model, tmp_path):
    """``search_af1(..., fit=FitSpec(size=...))`` as docs/fitset.md shows it: the spec is drawn for
    ``meta["task"]`` exactly as :func:`draw_fit_set` draws it by hand (same fit set, same results); without
    a task it is refused in one line."""
    from circuits.errors import ArgumentError

    p = PromptSpec("add_sub", n_prompts=40).prepare(zoo_model, means="cama", progress=False)
    spec = FitSpec(size=500)
    drawn = search_af1(zoo_model, p.tokens, p.answers, fit=spec, meta={"task": "add_sub"}, progress=False,
                       n_boot=10, out_dir=tmp_path / "a")
    by_hand = search_af1(zoo_model, p.tokens, p.answers, fit=draw_fit_set(zoo_model, "add_sub", p.tokens, spec),
                         progress=False, n_boot=10, out_dir=tmp_path / "b")
    fit_a = json.loads((tmp_path / "a" / "run.json").read_text())["means"]["fit"]
    fit_b = json.loads((tmp_path / "b" / "run.json").read_text())["means"]["fit"]
    assert fit_a == fit_b and fit_a["size"] == 500 and fit_a["task"] == "add_sub"
    assert [(r.config, r.n_faithful) for r in drawn.results] == [(r.config, r.n_faithful) for r in by_hand.results]
    with pytest.raises(ArgumentError, match=r"fit=FitSpec\(\.\.\.\) is drawn from a task's prompts: name the task"):
        search_af1(zoo_model, p.tokens, p.answers, fit=spec, progress=False)
