"""AF1 search: fast == naive, selection rule == brute force, auto grid == full grid, outputs, errors.

The evaluator and search tests run on every backend this TransformerLens offers (``hooked`` and
``bridge`` on 3.9, ``bridge`` on 4.x)."""

from __future__ import annotations

import json
import random

import pytest
import torch

import interventions as iv
from circuits import search as S
from circuits.faithfulness import faithfulness
from circuits.store.runs import RunMismatchError
from tests.conftest import (
    BACKENDS,
    ForwardStopped,
    build_hooked,
    build_model,
    disjoint_fit_tokens,
    needs_hooked,
    random_tokens,
    token_devices,
)

N_LAYERS = 4


@pytest.fixture(scope="module", params=BACKENDS)
def search_backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(arch, search_backend):
    """A tiny random model of ``arch`` on ``search_backend`` (same weights on both backends)."""
    torch.manual_seed(0)
    return build_model(arch, search_backend)


def own_answers(model, tokens):
    with torch.inference_mode():
        return model(tokens)[:, -1].argmax(-1)


@pytest.fixture(scope="module")
def data(model):
    tokens = random_tokens(32, 6, seed=3, values=5)
    answers = own_answers(model, tokens)
    cache = iv.MeanCache.fit(model, disjoint_fit_tokens(tokens), progress=False)  # means never from the scored prompts
    return tokens, answers, cache


def brute_force_select(faith: dict, threshold: float):
    """The rule written out independently: scan every configuration, keep the best by hand."""
    best = None
    for (w, t), f in faith.items():
        if f < threshold:
            continue
        if best is None or w > best[0] or (w == best[0] and t < best[1]):
            best = (w, t)
    return best


# --- exactness of the fast method -----------------------------------------------------------------
@pytest.mark.parametrize("ablation", ["cama", "mean", "zero"])
def test_fast_equals_naive_every_config(model, data, ablation):
    tokens, answers, cache = data
    fast = S.FastEvaluator(model, tokens, answers, cache, ablation, 20)
    naive = S.NaiveEvaluator(model, tokens, answers, cache, ablation, 20)
    n_configs = 0
    for w, t in S.configurations(N_LAYERS):
        cf, pf, df = fast.evaluate(w, t)
        cn, pn, dn = naive.evaluate(w, t)
        assert torch.equal(cf, cn), (w, t)
        torch.testing.assert_close(df, dn, atol=1e-4, rtol=0)
        torch.testing.assert_close(pf, pn, atol=1e-5, rtol=0)
        n_configs += 1
    assert n_configs == sum(N_LAYERS - w for w in range(-1, N_LAYERS)) == 15


@pytest.mark.parametrize("n_answer", [1, 2])
@pytest.mark.parametrize("ablation", ["cama", "mean", "zero"])
def test_grouped_tails_equal_per_configuration_passes(model, data, ablation, n_answer):
    """The search's evaluation (every transfer of a wait together, block by block, read out in chunks) against
    one complete intervened pass per configuration: the same argmax token at every answer position of every
    prompt in every configuration, and the answer logit, best other logit and log-sum-exp within 1e-4; for
    answers of one and of two tokens (teacher forcing), on every tail this backend offers."""
    from interventions.readout import answer_readout

    tokens, answers, cache = data
    if n_answer == 2:  # the prompt followed by its first answer token; the second answer token is the model's own
        tokens = torch.cat([tokens, answers[:, None]], dim=1)
        with torch.inference_mode():
            second = iv.run(model, tokens, []).argmax(-1)[:, -1]
        answers = torch.stack([answers, second.cpu()], dim=1)
        cache = iv.MeanCache.fit(model, disjoint_fit_tokens(tokens), progress=False)
    naive = S.NaiveEvaluator(model, tokens, answers, cache, ablation, 20)
    ref = {c: answer_readout(naive.last_logits(*c), answers) for c in S.configurations(N_LAYERS)}
    tails = [t for t in S.FastEvaluator.TAILS if t != "last" or iv.adapt(model).capabilities.frozen_bos_kv]
    for tail in tails:
        fast = S.FastEvaluator(model, tokens, answers, cache, ablation, 7, tail=tail)  # several prompt batches
        for c in S.configurations(N_LAYERS):
            got = fast.readout(*c)
            assert got.shape == ref[c].shape
            assert torch.equal(got[..., 3], ref[c][..., 3]), (tail, c)
            torch.testing.assert_close(got[..., :3], ref[c][..., :3], atol=1e-4, rtol=0)
        assert not fast.ready  # every configuration computed was read


@pytest.mark.parametrize("ablation", ["mean", "zero"])
def test_the_baselines_compute_one_prompt_after_the_wait(model, data, ablation, monkeypatch):
    """Under the plain-mean and zero baselines no prompt's tokens survive block ``wait >= 0``: the fast method
    runs the blocks after it on one prompt (every run is one row wide), and every prompt gets its logits."""
    tokens, answers, cache = data
    fast = S.FastEvaluator(model, tokens, answers, cache, ablation, 20)
    widths = []
    run_from = fast.adapter.run_from

    def record(x, *args, **kwargs):
        widths.append(int(x.shape[0]))
        return run_from(x, *args, **kwargs)

    def watch(fast):
        """Record the rows of every block call ``fast`` makes (``run_from`` and ``run_last_from``)."""
        monkeypatch.setattr(fast.adapter, "run_from", record)
        monkeypatch.setattr(fast.adapter, "run_last_from", lambda x, *a, **k: (
            widths.append(int(x.shape[0])), type(fast.adapter).run_last_from(fast.adapter, x, *a, **k))[1])

    watch(fast)
    for w, t in S.configurations(N_LAYERS):
        if w >= 0:
            logits = fast.last_logits(w, t)
            assert logits.shape[0] == len(tokens) and bool((logits == logits[:1]).all())
    assert widths and set(widths) == {1}
    # the whole grid, every transfer of a wait together: a block call holds one row per configuration at most
    widths.clear()
    fast = S.FastEvaluator(model, tokens, answers, cache, ablation, 20)
    watch(fast)
    for w, t in S.configurations(N_LAYERS):
        if w >= 0:
            fast.evaluate(w, t)
    assert widths and max(widths) <= N_LAYERS < len(tokens)


def test_naive_evaluator_matches_faithfulness_module(model, data):
    tokens, answers, cache = data
    naive = S.NaiveEvaluator(model, tokens, answers, cache, "cama", 64)
    for w, t in [(-1, 0), (1, 1), (3, 0)]:
        correct, _, _ = naive.evaluate(w, t)
        ref = faithfulness(model, tokens, answers, iv.af1_subgraph(N_LAYERS, w, t, cache), assume_correct=True)
        assert int(correct.sum()) == ref.n_faithful


def test_naive_evaluator_puts_token_ids_on_the_model_device(model, data):
    tokens, answers, cache = data
    naive = S.NaiveEvaluator(model, tokens, answers, cache, "cama", 64)
    with token_devices(model) as seen:
        for w, t in [(-1, 0), (1, 1)]:  # a plain forward pass and an intervened one
            with pytest.raises(ForwardStopped):
                naive.last_logits(w, t)
    assert seen == [torch.device("meta")] * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_position_tail_needs_the_rotary_shift(backend):
    """Without moving the last token to its true position the short tail is wrong: the shift is not a
    no-op (hooked: ``tail="last"`` re-rotated; bridge: ``tail="pair"`` with position ids)."""
    model = build_model("llama", backend)
    tokens = random_tokens(24, 7, seed=1, values=5)
    answers = own_answers(model, tokens)
    fast = S.FastEvaluator(model, tokens, answers, None, "zero", 24)
    assert fast.tail == ("last" if backend == "hooked" else "pair")
    naive = S.NaiveEvaluator(model, tokens, answers, None, "zero", 24)
    ref = naive.evaluate(-1, 0)[2]
    torch.testing.assert_close(fast.evaluate(-1, 0)[2], ref, atol=1e-4, rtol=0)
    fast.rotary = False
    fast.begin_wait(-1)
    assert (fast.evaluate(-1, 0)[2] - ref).abs().max() > 1e-2


@pytest.mark.parametrize("tail", ["last", "pair", "full"])
def test_other_tails_also_exact(model, data, tail):
    """The tail variants: BOS as a frozen key and value, [BOS, last] pairs, and every position (the
    fallback for other position schemes), on every backend that offers the capability."""
    tokens, answers, cache = data
    if tail == "last" and not iv.adapt(model).capabilities.frozen_bos_kv:
        with pytest.raises(ValueError, match="tail='last' needs the frozen_bos_kv capability.*use tail='pair'"):
            S.FastEvaluator(model, tokens, answers, cache, "cama", 16, tail=tail)
        return
    fast = S.FastEvaluator(model, tokens, answers, cache, "cama", 16, tail=tail)
    naive = S.NaiveEvaluator(model, tokens, answers, cache, "cama", 16)
    for w, t in [(-1, 2), (0, 0), (2, 1), (3, 0)]:
        cf, _, df = fast.evaluate(w, t)
        cn, _, dn = naive.evaluate(w, t)
        assert torch.equal(cf, cn)
        torch.testing.assert_close(df, dn, atol=1e-4, rtol=0)


def test_fast_uses_fewer_forward_blocks(data, model):
    tokens, answers, cache = data
    fast = S.FastEvaluator(model, tokens, answers, cache, "cama", 64)  # no tail call split in chunks
    for w, t in S.configurations(N_LAYERS):
        fast.evaluate(w, t)
    # tails run together block by block: one call per block after each wait (3 + 2 + 1 + 0 for waits 0..3,
    # 4 for wait -1) + 10 prefix blocks + 2 embedding passes (wait -1: transfer 0, then >= 1) + BOS pass,
    # versus 15 complete passes of 4 blocks each.
    assert fast.passes == 10 + 10 + 2 + 1


def test_fast_runs_no_block_below_its_start(data, model):
    """Counted at every block module: the full grid runs 34 blocks (BOS pass 4, transfer prefixes
    4+3+2+1, tails sum over (wait, transfer) of 3-wait-transfer = 20), on every backend, against 60 for
    the naive evaluator (15 passes of 4 blocks). A backend whose run_from also ran the blocks before
    ``start`` would count 4 per call."""
    tokens, answers, cache = data
    counts = [0] * N_LAYERS

    def count(i):
        def hook(module, args):
            counts[i] += 1
        return hook

    handles = [block.register_forward_pre_hook(count(i)) for i, block in enumerate(model.blocks)]
    try:
        fast = S.FastEvaluator(model, tokens, answers, cache, "cama", 64)  # no tail call split in chunks
        for w, t in S.configurations(N_LAYERS):
            fast.evaluate(w, t)
        fast_counts, counts[:] = list(counts), [0] * N_LAYERS
        naive = S.NaiveEvaluator(model, tokens, answers, cache, "cama", 32)
        for w, t in S.configurations(N_LAYERS):
            naive.evaluate(w, t)
    finally:
        for h in handles:
            h.remove()
    assert sum(fast_counts) == 4 + (4 + 3 + 2 + 1) + 10
    # block k runs in the BOS pass, as the transfer block of waits -1..k-1, and once (every configuration
    # whose tail has reached it, together) in the tails of each wait -1..k-1
    assert fast_counts == [1 + 1 + 1, 1 + 2 + 2, 1 + 3 + 3, 1 + 4 + 4]
    assert counts == [15] * N_LAYERS


# --- selection rule and grids ---------------------------------------------------------------------
def test_select_rule_examples():
    faith = {(2, 0): 0.5, (1, 0): 0.95, (1, 2): 0.99, (1, 1): 0.2, (0, 0): 1.0}
    assert S.select(faith, 0.9) == (1, 0)
    assert S.select(faith, 0.999) == (0, 0)
    assert S.select(faith, 1.01) is None
    assert S.smallest_transfers({(2, 0): 0.3, (1, 0): 0.1, (1, 1): 0.95, (0, 0): 0.5}, 3, 0.9) == {
        2: None, 1: 1, 0: S.NOT_EVALUATED, -1: S.NOT_EVALUATED}


@pytest.mark.parametrize("seed", range(40))
def test_auto_scan_equals_full_scan_on_non_monotone_tables(seed):
    """Synthetic faithfulness tables with random (non-monotone) values: the auto grid selects what the
    brute-force rule selects on the full table, and never evaluates more configurations."""
    rng = random.Random(seed)
    n_layers = rng.randint(1, 7)
    table = {c: rng.choice([0.0, 0.3, 0.89, 0.9, 0.95, 1.0]) for c in S.configurations(n_layers)}
    calls = []

    def evaluate(w, t):
        calls.append((w, t))
        return S.ConfigResult(w, t, table[(w, t)], 0, 1, 10, 0, 0.0, 0.0, "cama")

    full = S.scan(n_layers, 0.9, "full", evaluate)
    n_full = len(calls)
    calls.clear()
    auto = S.scan(n_layers, 0.9, "auto", evaluate)
    expected = brute_force_select(table, 0.9)
    assert n_full == len(table)
    assert S.select({c: r.faithfulness for c, r in full.items()}, 0.9) == expected
    assert S.select({c: r.faithfulness for c, r in auto.items()}, 0.9) == expected
    assert len(calls) <= n_full
    # evaluation order: waits descending, transfers ascending within a wait
    assert calls == sorted(calls, key=lambda c: (-c[0], c[1]))
    # honest per-wait report: known values agree with the full table's
    st_full = S.smallest_transfers({c: r.faithfulness for c, r in full.items()}, n_layers, 0.9)
    for w, v in S.smallest_transfers({c: r.faithfulness for c, r in auto.items()}, n_layers, 0.9).items():
        assert v == S.NOT_EVALUATED or v == st_full[w]


def test_search_selection_equals_brute_force_on_model(model):
    """answers = the model's own prediction under one AF1 configuration (base-correct prompts only):
    the faithfulness grid is then non-trivial; the search agrees with brute force and auto == full."""
    tokens = random_tokens(64, 6, seed=5, values=4)
    cache = iv.MeanCache.fit(model, disjoint_fit_tokens(tokens), progress=False)
    base = own_answers(model, tokens)
    with torch.inference_mode():
        under = iv.run(model, tokens, iv.af1_subgraph(N_LAYERS, 1, 1, cache))[:, -1].argmax(-1)
    keep = under == base
    assert int(keep.sum()) >= 8
    tokens, answers = tokens[keep], base[keep]
    faith = {}
    for w, t in S.configurations(N_LAYERS):
        faith[(w, t)] = faithfulness(model, tokens, answers, iv.af1_subgraph(N_LAYERS, w, t, cache),
                                     assume_correct=True, n_boot=10).faithfulness
    assert faith[(1, 1)] == 1.0
    thresholds = sorted(set(faith.values()))
    for threshold in thresholds[-3:]:
        expected = brute_force_select(faith, threshold)
        full = S.search_af1(model, tokens, answers, cache=cache, threshold=threshold, grid="full",
                            progress=False, n_boot=10)
        auto = S.search_af1(model, tokens, answers, cache=cache, threshold=threshold, grid="auto",
                            progress=False, n_boot=10)
        assert {r.config: r.faithfulness for r in full.results} == faith
        got_full = full.selected.config if full.selected else None
        got_auto = auto.selected.config if auto.selected else None
        assert got_full == got_auto == expected
        assert len(auto.results) <= len(full.results)
        assert full.smallest_transfer[expected[0]] == expected[1]
        assert auto.smallest_transfer[expected[0]] == expected[1]
        assert full.interventions == [x.to_dict() for x in iv.af1_subgraph(N_LAYERS, *expected, cache)]


def test_no_sufficient_configuration_is_reported(data, model):
    tokens, answers, cache = data
    wrong = (answers + 1) % 40  # nothing is answered "correctly" under any configuration ...
    wrong[0] = answers[0]       # ... except one prompt kept by the base check
    r = S.search_af1(model, tokens, wrong, cache=cache, threshold=1.0, grid="full", progress=False, n_boot=10)
    assert r.n_prompts == 1
    faith = r.faithfulness_map()
    assert r.selected is None or faith[r.selected.config] == 1.0
    assert S.select(faith, 1.0) == brute_force_select(faith, 1.0)
    empty = S.SearchResult(4, 0.9, "cama", "full", "fast", [], None, {}, 0, 0, 0, 0.0, 1.0, 1)
    assert empty.summary_line().startswith("no configuration reaches faithfulness 0.9")


def test_search_drops_base_incorrect_prompts(data, model):
    tokens, answers, cache = data
    wrong = answers.clone()
    wrong[:12] = (wrong[:12] + 1) % 40
    r = S.search_af1(model, tokens, wrong, cache=cache, grid="auto", progress=False, n_boot=10)
    assert r.n_prompts == 20
    assert r.base_accuracy == pytest.approx(20 / 32)
    assert all(x.n == 20 for x in r.results)


def test_bad_inputs_raise(data, model):
    tokens, answers, cache = data
    with pytest.raises(ValueError, match="grid='bogus'"):
        S.search_af1(model, tokens, answers, cache=cache, grid="bogus", progress=False)
    with pytest.raises(ValueError, match="threshold=1.5"):
        S.search_af1(model, tokens, answers, cache=cache, threshold=1.5, progress=False)
    with pytest.raises(ValueError, match="one token id per prompt"):
        S.search_af1(model, tokens, answers[:3], cache=cache, progress=False)
    with pytest.raises(ValueError, match=r"wait=4 is out of range: valid -1\.\.3"):
        S.check_config(N_LAYERS, 4, 0)
    with pytest.raises(ValueError, match=r"transfer=3 is out of range for wait=1: valid 0\.\.2"):
        S.check_config(N_LAYERS, 1, 3)


def summary_fit_is_recorded(out, fit) -> bool:
    """``summary.json`` and ``run.json`` name the fit set by its size and content hash."""
    from circuits.prompts.fitset import FitSet

    summary = json.loads((out / "summary.json").read_text())
    ident = json.loads((out / "run.json").read_text())
    sha = FitSet.given(fit).sha256
    return (summary["fit"]["fit"]["sha256"] == ident["means"]["fit"]["sha256"] == sha
            and summary["fit"]["coverage"]["n_under"] == 0 and summary["fit"]["fit"]["n_fit"] == len(fit))


# --- output directory -----------------------------------------------------------------------------
def small_case():
    """A tiny model, 32 prompts with its own answers, and a disjoint fit set for the means."""
    model = build_model("gpt2", BACKENDS[0])
    tokens = random_tokens(32, 6, seed=7, values=5)
    return model, tokens, own_answers(model, tokens), disjoint_fit_tokens(tokens)


def test_outputs_written(tmp_path):
    model, tokens, answers, fit = small_case()
    out = tmp_path / "run"
    r = S.search_af1(model, tokens, answers, fit_tokens=fit, grid="full", threshold=0.5, out_dir=out, progress=False,
                     n_boot=10, meta={"model": "tiny", "task": "random", "command": ["af1", "search"]})
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 15
    for rec in lines:
        assert {"wait", "transfer", "faithfulness", "ci_low", "ci_high", "n", "n_faithful",
                "mean_answer_prob", "mean_logit_diff", "ablation"} <= set(rec)
        assert rec["faithfulness"] == r.result(rec["wait"], rec["transfer"]).faithfulness
    prompts = [json.loads(x) for x in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 32 and {"prompt", "answer"} <= set(prompts[0])
    cache = iv.MeanCache.load(out / "means.safetensors")
    assert cache.n_prompts == len(fit) and not bool(cache.contains(tokens).any())
    assert summary_fit_is_recorded(out, fit)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("model", "task", "seed", "threshold", "base_accuracy", "n_prompts", "selected", "interventions",
                "seconds", "circuits_version", "transformer_lens_version", "smallest_transfer_per_wait", "grid",
                "ablation", "command"):
        assert key in summary, key
    assert summary["model"] == "tiny" and summary["n_prompts"] == 32 and summary["base_accuracy"] == 1.0
    if r.selected is not None:
        assert summary["selected"]["wait"] == r.selected.wait
        rebuilt = [iv.Intervention.from_dict(spec, cache=cache) for spec in summary["interventions"]]
        assert rebuilt == iv.af1_subgraph(4, r.selected.wait, r.selected.transfer, cache)
    html = (out / "report.html").read_text()
    assert '"type":"heatmap"' in html and "faithfulness" in html
    # the heatmap's cell values are in the page
    some = lines[0]
    assert f"{some['faithfulness']:.2f}" in html
    assert "Plotly.newPlot" in html and 'src="http' not in html  # plotly.js embedded, no CDN


def test_resume_after_interruption(tmp_path):
    model, tokens, answers, fit = small_case()
    out = tmp_path / "run"
    kwargs = dict(grid="full", threshold=0.5, out_dir=out, progress=False, n_boot=10)
    first = S.search_af1(model, tokens, answers, fit_tokens=fit, **kwargs)
    path = out / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    k = 6
    path.write_text("".join(lines[:k]) + lines[k][: len(lines[k]) // 2])  # a torn write
    again = S.search_af1(model, tokens, answers, fit_tokens=fit, **kwargs)
    assert again.n_resumed == k
    assert again.n_evaluated == 15 - k
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in first.results]
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(records) == 15
    assert len({(r["wait"], r["transfer"]) for r in records}) == 15
    # a third run recomputes nothing
    third = S.search_af1(model, tokens, answers, fit_tokens=fit, **kwargs)
    assert third.n_evaluated == 0 and third.n_resumed == 15


def test_auto_then_full_reuses_results(tmp_path):
    model, tokens, answers, fit = small_case()
    out = tmp_path / "run"
    auto = S.search_af1(model, tokens, answers, fit_tokens=fit, grid="auto", threshold=0.3, out_dir=out, progress=False, n_boot=10)
    full = S.search_af1(model, tokens, answers, fit_tokens=fit, grid="full", threshold=0.3, out_dir=out, progress=False, n_boot=10)
    assert full.n_resumed == len(auto.results)
    assert full.n_evaluated == 15 - len(auto.results)
    assert (full.selected is None) == (auto.selected is None)
    if auto.selected is not None:
        assert full.selected.config == auto.selected.config


def test_different_command_in_same_dir_raises(tmp_path):
    model, tokens, answers, fit = small_case()
    out = tmp_path / "run"
    S.search_af1(model, tokens, answers, fit_tokens=fit, grid="auto", threshold=0.5, out_dir=out, progress=False, n_boot=10)
    # the threshold only changes the selection: another one resumes (tests/circuits/test_results.py)
    with pytest.raises(RunMismatchError, match="ablation: 'cama' -> 'zero'"):
        S.search_af1(model, tokens, answers, fit_tokens=fit, ablation="zero", threshold=0.5, out_dir=out, progress=False, n_boot=10)
    with pytest.raises(RunMismatchError, match="n_prompts: 32 -> 31"):
        S.search_af1(model, tokens[:31], answers[:31], fit_tokens=fit, threshold=0.5, out_dir=out, progress=False, n_boot=10)


def test_given_cache_is_part_of_the_identity(tmp_path):
    model, tokens, answers, fit = small_case()
    out = tmp_path / "run"
    S.search_af1(model, tokens, answers, fit_tokens=fit, threshold=0.5, out_dir=out, progress=False, n_boot=10)
    other = iv.MeanCache.fit(model, fit[:200], progress=False)
    with pytest.raises(RunMismatchError, match=r"differing parameters: means.cache_sha256: '<missing>' -> '[0-9a-f]{12}\.\.\.'"):
        S.search_af1(model, tokens, answers, cache=other, threshold=0.5, out_dir=out, progress=False, n_boot=10)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_evaluator_tail_follows_capabilities(arch, monkeypatch):
    """The tail is chosen from the adapter's capabilities, not the backend's name: a bridge (positions,
    no frozen BOS cache) runs "pair"; an adapter without positions falls back to "full" where positions
    are rotary, and refuses "pair" there with a message naming the capability."""
    from tests.conftest import build_bridge

    bridge = build_bridge(arch)
    tokens = random_tokens(8, 6, seed=5, values=5)
    answers = own_answers(bridge, tokens)
    assert S.FastEvaluator(bridge, tokens, answers, None, "zero", 8).tail == "pair"
    with pytest.raises(ValueError, match="tail='last' needs the frozen_bos_kv capability.*use tail='pair'"):
        S.FastEvaluator(bridge, tokens, answers, None, "zero", 8, tail="last")
    monkeypatch.setattr(iv.BridgeAdapter, "capabilities", iv.Capabilities(skips_blocks=True))
    rotary = arch == "llama"
    assert S.FastEvaluator(bridge, tokens, answers, None, "zero", 8).tail == ("full" if rotary else "pair")
    if rotary:
        with pytest.raises(ValueError, match="tail='pair' needs the positions capability.*use tail='full'"):
            S.FastEvaluator(bridge, tokens, answers, None, "zero", 8, tail="pair")


@needs_hooked
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_bridge_search_equals_hooked_search(arch):
    """The fast search on a TransformerBridge gives the numbers of its HookedTransformer twin."""
    from tests.conftest import build_bridge

    hooked, bridge = build_hooked(arch), build_bridge(arch)
    tokens = random_tokens(24, 6, seed=5, values=5)
    answers = own_answers(hooked, tokens)
    fit = disjoint_fit_tokens(tokens)
    ref = S.search_af1(hooked, tokens, answers, fit_tokens=fit, grid="full", progress=False, n_boot=50)
    got = S.search_af1(bridge, tokens, answers, fit_tokens=fit, grid="full", progress=False, n_boot=50)
    assert got.method == ref.method == "fast"
    assert {(r.wait, r.transfer): r.n_faithful for r in got.results} == {
        (r.wait, r.transfer): r.n_faithful for r in ref.results
    }
    for a, b in zip(got.results, ref.results):
        assert a.mean_logit_diff == pytest.approx(b.mean_logit_diff, abs=1e-4)
