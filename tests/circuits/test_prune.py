"""Greedy head pruning and head attribution, checked against brute-force ablations."""

from __future__ import annotations

import json

import pytest
import torch

import interventions as iv
from circuits.faithfulness import last_token_metrics
from circuits.prune import area_under_curve, head_attention, prune_heads, transfer_heads
from circuits.prune.attribution import head_attribution, head_attribution_per_prompt
from tests.conftest import arch_config, build_default, disjoint_fit_tokens, needs_hooked, random_tokens, use_prompts

N_LAYERS = 4


def setup(model, n=48, seed=11, wait=0, transfer=2, agree=True):
    """Prompts, a CAMA cache fitted on a disjoint fit set and answers = the model's own argmax under the full
    AF1 subgraph, keeping the prompts where the plain model agrees (all base-correct, unpruned
    faithfulness 1)."""
    tokens = random_tokens(8 * n, 6, seed=seed, values=6)
    cache = iv.MeanCache.fit(model, disjoint_fit_tokens(tokens, n=800), progress=False)
    with torch.inference_mode():
        plain = model(tokens)[:, -1].argmax(-1)
        sub = iv.run(model, tokens, iv.af1_subgraph(N_LAYERS, wait, transfer, cache))[:, -1].argmax(-1)
    keep = torch.nonzero((plain == sub) | (not agree)).flatten()[:n]
    assert len(keep) == n, "not enough prompts where the plain model and the subgraph agree"
    return tokens[keep], cache, sub[keep]


def brute_metrics(model, tokens, answers, wait, transfer, cache, removed, method="zero"):
    """(faithfulness, mean logit diff) with ``removed`` heads ablated, computed independently."""
    ivs = iv.af1_subgraph(N_LAYERS, wait, transfer, cache)
    if removed:
        ivs.append(iv.HeadAblation(heads=list(removed), method=method, cache=cache))
    with torch.inference_mode():
        logits = iv.run(model, tokens, ivs)[:, -1]
    correct, _, diff = last_token_metrics(logits, answers)
    return float(correct.float().mean()), float(diff.mean())


class ForwardCounter:
    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.n += 1

    def close(self):
        self.handle.remove()


def test_each_step_removes_the_least_harmful_head(model):
    tokens, cache, answers = setup(model)
    wait, transfer = 0, 2
    res = prune_heads(model, tokens, answers, wait=wait, transfer=transfer, cache=cache, progress=False, target=0.75)
    heads = transfer_heads(N_LAYERS, model.cfg.n_heads, wait, transfer)
    assert len(heads) == 8 and res.n_prompts == 48 and res.n_dropped == 0
    assert res.curve[0].faithfulness == 1.0
    assert [p.n_heads_kept for p in res.curve] == list(range(8, -1, -1))
    assert res.curve[-1].heads_kept == [] and sorted(res.removal_order) == heads
    f0, _ = brute_metrics(model, tokens, answers, wait, transfer, cache, [])
    assert res.curve[0].faithfulness == pytest.approx(f0)
    removed: list = []
    for point in res.curve[1:]:
        remaining = [h for h in heads if h not in removed]
        scores = {h: brute_metrics(model, tokens, answers, wait, transfer, cache, removed + [h]) for h in remaining}
        best_f = max(f for f, _ in scores.values())
        best_d = max(d for f, d in scores.values() if f == best_f)
        chosen_f, chosen_d = scores[point.removed]
        # The chosen head has the highest faithfulness, then (up to float noise) the highest logit diff.
        assert chosen_f == best_f, (point.step, point.removed, scores)
        assert chosen_d >= best_d - 1e-4, (point.step, point.removed, scores)
        ties = [h for h, (f, d) in scores.items() if f == best_f and abs(d - chosen_d) <= 1e-6]
        assert point.removed == min(ties)
        assert point.faithfulness == pytest.approx(chosen_f) and point.mean_logit_diff == pytest.approx(chosen_d, abs=1e-4)
        assert point.ci_low <= point.faithfulness <= point.ci_high
        removed.append(point.removed)
        assert point.heads_kept == [h for h in heads if h not in removed]
    # Smallest set: the last curve point with faithfulness >= target.
    above = [p for p in res.curve if p.faithfulness >= 0.75]
    assert res.smallest_step == above[-1].step and res.smallest_faithfulness >= 0.75
    assert res.smallest_head_set == res.curve[res.smallest_step].heads_kept
    assert all(p.faithfulness < 0.75 for p in res.curve[res.smallest_step + 1 :])
    f = [p.faithfulness for p in res.curve]
    assert res.auc == pytest.approx(sum((f[i] + f[i + 1]) / 2 / 8 for i in range(8)))
    assert 0.0 <= res.auc <= 1.0
    assert res.passes_total == 1 + sum(range(1, 9)) and res.attribution_passes_total == 8


def test_auc_by_hand():
    assert area_under_curve([1.0, 1.0, 0.0]) == pytest.approx(0.75)
    assert area_under_curve([1.0, 0.5]) == pytest.approx(0.75)


def test_confirm_top_uses_expected_passes_and_confirms_the_top_estimates():
    torch.manual_seed(0)
    model = build_default("gpt2")
    tokens, cache, answers = setup(model)
    counter = ForwardCounter(model)
    try:
        res = prune_heads(model, tokens, answers, wait=0, transfer=2, cache=cache, confirm_top=3,
                          progress=False, batch_size=64, target=0.5)
    finally:
        counter.close()
    expected = [1] + [min(3, r) for r in range(8, 0, -1)]
    assert [p.passes for p in res.curve] == expected and res.passes_total == sum(expected) == 1 + 3 * 6 + 2 + 1
    assert [p.attribution_passes for p in res.curve] == [0] + [1] * 8
    # Model forwards (one batch each): base-correct check + confirmed passes + attribution + attention.
    assert counter.n == 1 + sum(expected) + 8 + (1 if res.attention else 0)
    for point in res.curve[1:]:
        est = {tuple(c["head"]): c["estimate"] for c in point.candidates}
        top = sorted(est, key=lambda h: (-est[h], h))[:3]
        confirmed = {tuple(c["head"]): (c["faithfulness"], c["mean_logit_diff"]) for c in point.candidates
                     if c["faithfulness"] is not None}
        assert sorted(confirmed) == sorted(top)
        best = min(confirmed, key=lambda h: (-confirmed[h][0], -confirmed[h][1], h))
        assert point.removed == best


def _linear_model():
    """Attention-only, no normalisation: the logits are linear in the last block's head outputs."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, d_head=8, n_heads=4, n_ctx=16, d_vocab=40,
                                  attn_only=True, normalization_type=None, seed=3, initializer_range=0.2,
                                  dtype=torch.float64)
    return HookedTransformer(cfg).eval()


@needs_hooked
@pytest.mark.parametrize("method", ["zero", "mean"])
def test_attribution_is_exact_when_logits_are_linear_in_z(method):
    model = _linear_model()
    tokens = random_tokens(40, 6, seed=5, values=6)
    cache = iv.MeanCache.fit(model, disjoint_fit_tokens(tokens), progress=False)
    ivs = iv.af1_subgraph(2, 0, 1, cache)
    with torch.inference_mode():
        base = iv.run(model, tokens, ivs)[:, -1]
    answers = base.argmax(-1)
    heads = [(1, h) for h in range(4)]
    est = head_attribution_per_prompt(model, tokens, answers, heads, ivs, method=method, cache=cache)
    _, _, base_diff = last_token_metrics(base, answers)
    runner_up = base.scatter(-1, answers[:, None], float("-inf")).argmax(-1)
    n_exact = 0
    for j, head in enumerate(heads):
        with torch.inference_mode():
            after = iv.run(model, tokens, ivs + [iv.HeadAblation(heads=[head], method=method, cache=cache)])[:, -1]
        _, _, diff = last_token_metrics(after, answers)
        real = (diff - base_diff).double()
        same = after.scatter(-1, answers[:, None], float("-inf")).argmax(-1) == runner_up
        # Same best other token: the estimate is the exact change. Otherwise the max over the other
        # tokens is convex, so the true change can only be lower than the linear estimate.
        torch.testing.assert_close(real[same], est[same, j].double(), atol=1e-6, rtol=1e-6)
        assert bool((real <= est[:, j].double() + 1e-6).all())
        n_exact += int(same.sum())
    assert n_exact >= 40, "the check must cover many prompts"
    sums = head_attribution(model, tokens, answers, heads, ivs, method=method, cache=cache)
    assert sums[heads[0]] == pytest.approx(float(est[:, 0].sum()))


@needs_hooked
def test_attribution_is_the_directional_derivative(arch):
    """Through every later block (LN, MLP, rotary, GQA): estimate = d/d eps of the summed logit diff
    when z moves by eps * (ablation - z), checked by a finite difference in float64."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model = HookedTransformer(HookedTransformerConfig(**arch_config(arch), dtype=torch.float64)).eval()
    tokens, cache, answers = setup(model, n=24, agree=False)
    ivs = iv.af1_subgraph(N_LAYERS, 0, 2, cache)
    heads = [(1, 0), (1, 3), (2, 1)]
    est = head_attribution(model, tokens, answers, heads, ivs, method="mean", cache=cache)
    eps = 1e-6

    def metric(head, scale):
        layer, h = head

        def hook(z, hook=None):
            out = z.clone()
            target = cache.z_mean[layer][:, h].to(z.dtype)
            out[:, :, h] = z[:, :, h] + scale * (target - z[:, :, h])
            return out

        with torch.inference_mode(), iv.apply(model, ivs):
            logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)])[:, -1]
        # In float64 (last_token_metrics works in float32, too coarse for a finite difference).
        answer = logits.gather(-1, answers[:, None]).squeeze(-1)
        other = logits.scatter(-1, answers[:, None], float("-inf")).max(-1).values
        return float((answer - other).sum())

    for head in heads:
        fd = (metric(head, eps) - metric(head, 0.0)) / eps
        assert abs(est[head]) > 1e-3
        assert fd == pytest.approx(est[head], rel=1e-3, abs=1e-6), head


def test_resume_after_truncated_curve_gives_identical_results(tmp_path):
    torch.manual_seed(0)
    model = build_default("llama")
    tokens, cache, answers = setup(model)
    kw = dict(wait=0, transfer=2, cache=cache, progress=False, batch_size=64, meta={"model": "tiny-llama"})
    ref = prune_heads(model, tokens, answers, **kw)

    out = tmp_path / "run"
    prune_heads(model, tokens, answers, out_dir=out, **kw)
    curve_path = out / "curve.jsonl"
    lines = curve_path.read_text().splitlines(keepends=True)
    assert len(lines) == 9
    # Interrupted while writing row 5: 4 complete rows (steps 0..3) and a torn line.
    curve_path.write_text("".join(lines[:4]) + lines[4][:17])
    counter = ForwardCounter(model)
    try:
        res = prune_heads(model, tokens, answers, out_dir=out, **kw)
    finally:
        counter.close()
    assert res.removal_order == ref.removal_order
    assert [p.faithfulness for p in res.curve] == [p.faithfulness for p in ref.curve]
    assert res.smallest_head_set == ref.smallest_head_set and res.auc == ref.auc
    assert res.passes_total == ref.passes_total
    # Only steps 4..8 ran: 5 + 4 + 3 + 2 + 1 confirmed passes and 5 attribution passes.
    assert res.passes_run == 15
    assert counter.n == 1 + 15 + 5 + (1 if res.attention else 0)
    rows = [json.loads(line) for line in curve_path.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(9))
    assert [r["removed"] for r in rows[1:]] == [list(h) for h in ref.removal_order]

    again = prune_heads(model, tokens, answers, out_dir=out, **kw, target=0.3)
    assert again.passes_run == 0 and again.removal_order == ref.removal_order
    low = [p for p in again.curve if p.faithfulness >= 0.3][-1]
    assert again.smallest_step == low.step and json.loads((out / "summary.json").read_text())["target"] == 0.3
    prune_heads(model, tokens, answers, out_dir=out, **kw)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny-llama" and summary["wait"] == 0 and summary["transfer"] == 2
    assert summary["smallest_head_set"] == [list(h) for h in ref.smallest_head_set]
    assert summary["auc"] == pytest.approx(ref.auc) and summary["passes_total"] == ref.passes_total
    assert set(summary["versions"]) >= {"torch", "transformer_lens"}
    assert len(summary["attention"]["key_labels"]) == tokens.shape[1]
    html = (out / "report.html").read_text()
    assert "Greedy head pruning" in html and "plotly" in html.lower()
    assert ref.smallest_head_set and html.count('class="plotly-graph-div"') == 3  # curve, kept heads, attention
    assert iv.MeanCache.load(out / "means.safetensors").sha256 == cache.sha256
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 48 and prompts[3]["tokens"] == tokens[3].tolist() and prompts[3]["index"] == 3

    with pytest.raises(FileExistsError, match="different command.*method"):
        prune_heads(model, tokens, answers, out_dir=out, **kw, method="mean")
    other = tmp_path / "search"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"model": "tiny-llama", "threshold": 0.9}))
    with pytest.raises(FileExistsError, match="different command"):
        prune_heads(model, tokens, answers, out_dir=other, **kw)
    (tmp_path / "orphan").mkdir()
    (tmp_path / "orphan" / "curve.jsonl").write_text("{}\n")
    with pytest.raises(FileExistsError, match="cannot tell which command"):
        prune_heads(model, tokens, answers, out_dir=tmp_path / "orphan", **kw)


def test_mean_method_writes_the_cache_head_means():
    torch.manual_seed(0)
    model = build_default("neox")
    tokens, cache, answers = setup(model)
    res = prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, method="mean", rank="none",
                      progress=False)
    zero = prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, method="zero", rank="none",
                       progress=False)
    ivs = iv.af1_subgraph(N_LAYERS, 0, 1, cache)
    step1 = {tuple(c["head"]): c for c in res.curve[1].candidates}
    for head in transfer_heads(N_LAYERS, 4, 0, 1):
        layer, h = head

        def write_mean(z, hook=None):
            out = z.clone()
            out[:, :, h] = cache.z_mean[layer][:, h]
            return out

        with torch.inference_mode(), iv.apply(model, ivs):
            logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", write_mean)])[:, -1]
        correct, _, diff = last_token_metrics(logits, answers)
        assert step1[head]["faithfulness"] == pytest.approx(float(correct.float().mean()))
        assert step1[head]["mean_logit_diff"] == pytest.approx(float(diff.mean()), abs=1e-5)
        assert step1[head]["estimate"] is None
    zero1 = {tuple(c["head"]): c["mean_logit_diff"] for c in zero.curve[1].candidates}
    assert any(abs(zero1[h] - step1[h]["mean_logit_diff"]) > 1e-3 for h in zero1)


def test_head_attention_matches_the_cached_pattern():
    torch.manual_seed(0)
    model = build_default("gptj")
    tokens, cache, _ = setup(model, n=20)
    ivs = iv.af1_subgraph(N_LAYERS, 0, 1, cache)
    att = head_attention(model, tokens, [(1, 2), (3, 0)], ivs, batch_size=7)
    with torch.inference_mode(), iv.apply(model, ivs):
        _, acts = model.run_with_cache(tokens)
    for layer, head in [(1, 2), (3, 0)]:
        expected = acts[f"blocks.{layer}.attn.hook_pattern"][:, head, -1].mean(0)
        torch.testing.assert_close(att[(layer, head)], expected.float(), atol=1e-6, rtol=1e-5)
    # Block 3 is a compute block: the last token sees only BOS and itself.
    assert float(att[(3, 0)][1:-1].abs().max()) == 0.0 and float(att[(3, 0)].sum()) == pytest.approx(1.0)
    assert float(att[(1, 2)][1:-1].min()) > 0.0  # transfer block: full peek of the last token


def test_errors_name_the_bad_value():
    torch.manual_seed(0)
    model = build_default("gpt2")
    tokens, cache, answers = setup(model, n=8)
    with pytest.raises(ValueError, match=r"transfer=0: head pruning needs transfer heads, give transfer 1\.\.2"):
        prune_heads(model, tokens, answers, wait=1, transfer=0, cache=cache)
    with pytest.raises(ValueError, match=r"wait=3 is out of range: valid -1\.\.2"):
        prune_heads(model, tokens, answers, wait=3, transfer=1, cache=cache)
    with pytest.raises(ValueError, match=r"wait=-2 is out of range"):
        prune_heads(model, tokens, answers, wait=-2, transfer=1, cache=cache)
    with pytest.raises(ValueError, match=r"transfer=3 is out of range for wait=1: valid 1\.\.2"):
        prune_heads(model, tokens, answers, wait=1, transfer=3, cache=cache)
    with pytest.raises(ValueError, match="needs means .* fitted on prompts other than the ones it scores"):
        prune_heads(model, tokens, answers, wait=-1, transfer=1, method="mean")
    with pytest.raises(ValueError, match="confirm_top=0 must be an integer >= 1"):
        prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, confirm_top=0)
    with pytest.raises(ValueError, match="needs rank=attribution"):
        prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, rank="none", confirm_top=2)
    with pytest.raises(ValueError, match="method='median' is not valid"):
        prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, method="median")
    with pytest.raises(ValueError, match="target=1.5 is out of range"):
        prune_heads(model, tokens, answers, wait=0, transfer=1, cache=cache, target=1.5)


def test_cli_prune_runs_resumes_and_reports_errors(tmp_path, monkeypatch, capsys):
    from circuits import cli
    from circuits.models import loading

    torch.manual_seed(0)
    model = build_default("gpt2")
    tokens = random_tokens(32, 6, seed=4, values=5)
    fits = []
    real_fit = iv.MeanCache.fit

    def counting_fit(*a, **k):
        fits.append(1)
        return real_fit(*a, **k)

    monkeypatch.setattr(loading, "load_model", lambda name, device="cpu", backend=None, dtype=None: model)
    use_prompts(monkeypatch, tokens, disjoint_fit_tokens(tokens))
    monkeypatch.setattr(iv.MeanCache, "fit", counting_fit)
    out = tmp_path / "prune"
    argv = ["prune", "--model", "tiny", "--task", "add", "--wait", "0", "--transfer", "1", "--n-prompts", "24",
            "--target", "0.8", "--confirm-top", "2", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny" and summary["task"] == "add" and summary["base_accuracy"] == 1.0
    assert summary["command"][:2] == ["af1", "prune"] and "--confirm-top" in summary["command"]
    assert summary["n_prompts"] == 24 and summary["passes_total"] == 1 + 2 + 2 + 2 + 1
    assert f"AUC {summary['auc']:.3f}" in text and "8 confirmed passes" in text
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 24 and prompts[5]["tokens"] == tokens[5].tolist()
    assert prompts[5]["prompt"] == " ".join(map(str, tokens[5].tolist()))
    assert len(fits) == 1
    # Same command again: nothing recomputed, the saved means are reused (no second fit).
    assert cli.main(argv) == 0
    assert "(0 this run)" in capsys.readouterr().out and len(fits) == 1
    assert cli.main([*argv[:-1], str(tmp_path / "zero"), "--transfer", "0"]) == 2
    assert "--transfer 0: head pruning needs transfer heads" in capsys.readouterr().err
    assert cli.main([*argv, "--method", "mean"]) == 2
    assert "different command" in capsys.readouterr().err
    assert cli.main([*argv[:-1], str(tmp_path / "w"), "--wait", "3"]) == 2
    assert "wait=3 is out of range: valid -1..2" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_candidates_share_passes_with_the_numbers_of_one_pass_each(model, method):
    """A removal step's candidates evaluated together (three per forward pass, each block of rows with its own
    heads removed) give every candidate's logits as its own pass with HeadAblation does, and take a third
    of the passes."""
    from circuits.prune.heads import candidate_logits

    tokens, cache, answers = setup(model, n=16)
    wait, transfer = 0, 2
    base = iv.af1_subgraph(N_LAYERS, wait, transfer, cache)
    removed = [(1, 0), (2, 3)]
    candidates = [h for h in transfer_heads(N_LAYERS, model.cfg.n_heads, wait, transfer) if h not in removed]
    counter = ForwardCounter(model)
    try:
        got = candidate_logits(model, tokens, 1, base, removed, candidates, method, cache, batch_size=48)
    finally:
        counter.close()
    assert counter.n == -(-len(candidates) // 3) == 2
    for h in candidates:
        ref_ivs = [*base, iv.HeadAblation(heads=sorted([*removed, h]), method=method, cache=cache)]
        with torch.inference_mode():
            ref = iv.run(model, tokens, ref_ivs)[:, -1].float()
        assert torch.equal(got[h].argmax(-1), ref.argmax(-1)), h
        torch.testing.assert_close(got[h], ref, atol=1e-5, rtol=0)


def test_prune_from_search_takes_its_configuration(tmp_path, monkeypatch, capsys, caplog):
    """``--from-search DIR``: the search's selected configuration; where it selected none, its most faithful one with
    a transfer block (logged); one-line refusals for a selection without transfer heads, both or neither given, a
    folder that is no search, and a search of another ablation."""
    import dataclasses
    import logging

    from circuits import cli
    from circuits.models import loading
    from circuits.search.results import SearchResult

    torch.manual_seed(0)
    model = build_default("gpt2")
    tokens = random_tokens(32, 6, seed=4, values=5)
    monkeypatch.setattr(loading, "load_model", lambda name, device="cpu", backend=None, dtype=None: model)
    use_prompts(monkeypatch, tokens, disjoint_fit_tokens(tokens))
    common = ["--model", "tiny", "--task", "add", "--n-prompts", "24", "--no-progress"]
    search, real_load = tmp_path / "search", SearchResult.load
    assert cli.main(["search", *common, "--grid", "full", "--threshold", "0.5", "--out", str(search)]) == 0
    found = SearchResult.load(search)
    assert found.selected is not None and found.selected.config == (3, 0)  # the last block alone: no transfer heads
    argv = ["prune", *common, "--target", "0.8", "--confirm-top", "1", "--from-search", str(search)]
    capsys.readouterr()
    assert cli.main([*argv, "--out", str(tmp_path / "p0")]) == 2
    assert "the search selected wait=3 with no transfer block" in capsys.readouterr().err

    def run_with(result: SearchResult, out: str) -> tuple[int, int]:
        monkeypatch.setattr(SearchResult, "load", classmethod(lambda cls, d, **k: result))
        assert cli.main([*argv, "--out", str(tmp_path / out)]) == 0
        identity = json.loads((tmp_path / out / "run.json").read_text())
        return identity["wait"], identity["transfer"]

    # a selection with transfer heads is taken as it is
    assert run_with(dataclasses.replace(found, selected=found.result(0, 2)), "p1") == (0, 2)
    # a search that selected nothing: its most faithful configuration with transfer >= 1, by an independent scan
    unselected = found.with_threshold(0.99)
    assert unselected.selected is None
    pool = [(r.faithfulness, r.wait, -r.transfer) for r in found.results if r.transfer >= 1]
    _, wait, minus_transfer = max(pool)
    with caplog.at_level(logging.INFO):
        assert run_with(unselected, "p2") == (wait, -minus_transfer)
    assert "selected no configuration at threshold 0.99: pruning its most faithful one" in caplog.text
    monkeypatch.setattr(SearchResult, "load", real_load)
    capsys.readouterr()

    refusals = [
        ([*argv, "--wait", "0", "--out", str(tmp_path / "r1")], "give --from-search DIR or --wait/--transfer, not both"),
        ([*argv[:-2], "--out", str(tmp_path / "r2")], "give --wait W --transfer T"),
        ([*argv[:-1], str(tmp_path), "--out", str(tmp_path / "r3")], "no summary.json there"),
        ([*argv, "--ablation", "zero", "--out", str(tmp_path / "r4")],
         "that search ran with ablation cama, not zero: give --ablation cama"),
    ]
    for args, message in refusals:
        assert cli.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not (tmp_path / args[-1]).exists()
