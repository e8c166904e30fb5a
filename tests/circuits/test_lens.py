"""Early decoding and interchange against independent recomputations and brute-force loops."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from circuits.lens import (
    counterfactual_rows,
    counterfactual_set,
    decode_states,
    early_decode,
    interchange,
    lens_states,
    numeric_table,
    parse_operands,
)
from tests.conftest import BACKENDS, build_default, hooked_state, needs_hooked, random_tokens

# Vocabulary convention of the random models here: ids 3..29 are the numbers 0..26, 30 is "+", 31 is "-",
# 32 is "=".
NUMERIC = {i: i - 3 for i in range(3, 30)}
OPS = {30: "+", 31: "-"}


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def arith_tokens(n: int, seed: int = 0) -> torch.Tensor:
    """``[n, 5]`` prompts ``BOS a op b =`` with numeric a, b and an operator."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.zeros((n, 5), dtype=torch.long)
    toks[:, 1] = torch.randint(3, 30, (n,), generator=g)
    toks[:, 2] = torch.randint(30, 32, (n,), generator=g)
    toks[:, 3] = torch.randint(3, 30, (n,), generator=g)
    toks[:, 4] = 32
    return toks


def manual_norm(model, x: torch.Tensor) -> torch.Tensor:
    """Final normalisation written out from the weights (independent of ``model.ln_final``)."""
    cfg, ln = model.cfg, model.ln_final
    if cfg.normalization_type == "LN":
        x = x - x.mean(-1, keepdim=True)
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * ln.w + ln.b
    if cfg.normalization_type == "RMS":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * ln.w
    raise AssertionError(cfg.normalization_type)


def reference_states(model, tokens):
    """{(layer, sub): [batch, d_model]} from a full run_with_cache (no lens code)."""
    _, cache = model.run_with_cache(tokens)
    out = {}
    for layer in range(model.cfg.n_layers):
        if model.cfg.parallel_attn_mlp:
            out[(layer, "attn")] = cache[f"blocks.{layer}.hook_resid_pre"][:, -1] + cache[f"blocks.{layer}.hook_attn_out"][:, -1]
        else:
            out[(layer, "attn")] = cache[f"blocks.{layer}.hook_resid_mid"][:, -1]
        out[(layer, "mlp")] = cache[f"blocks.{layer}.hook_resid_post"][:, -1]
    return out


# --- decoding ------------------------------------------------------------------------------------
def test_final_layer_decoding_reproduces_logits(model):
    tokens = random_tokens(12, 6, seed=3)
    logits = model(tokens)[:, -1]
    last = model.cfg.n_layers - 1
    states = lens_states(model, tokens)
    torch.testing.assert_close(decode_states(model, states[(last, "mlp")]), logits, rtol=1e-5, atol=1e-5)
    answers = logits.argmax(-1)
    res = early_decode(model, tokens, answers=answers, numeric_values=NUMERIC, progress=False)
    assert (res.answer_rank[:, -1, -1] == 0).all()
    np.testing.assert_allclose(res.answer_prob[:, -1, -1], logits.softmax(-1).max(-1).values.numpy(), rtol=1e-5)
    sub = early_decode(model, tokens, answers=answers, numeric_values=NUMERIC, layers=[1, 3], progress=False)
    assert sub.labels() == ["L1 attn", "L1 mlp", "L3 attn", "L3 mlp"]
    np.testing.assert_allclose(sub.answer_prob, res.answer_prob[:, [1, 3]], rtol=1e-6)
    # Earlier states differ from the output (the lens reads something else there).
    assert not torch.allclose(decode_states(model, states[(0, "attn")]), logits, atol=1e-3)


def test_states_match_run_with_cache(model):
    tokens = random_tokens(6, 5, seed=4)
    ref = reference_states(model, tokens)
    got = lens_states(model, tokens)
    assert set(got) == set(ref)
    for key in ref:
        torch.testing.assert_close(got[key], ref[key], rtol=1e-5, atol=1e-5)


@needs_hooked  # the reference is computed with HookedTransformer's block modules
@pytest.mark.parametrize("arch", ["neox", "gptj"])
def test_parallel_post_attention_recomputed_from_block_pieces(arch):
    model = build_default(arch, seed=1)
    tokens = random_tokens(5, 6, seed=5)
    assert model.cfg.parallel_attn_mlp and "blocks.0.hook_resid_mid" not in model.hook_dict
    got = lens_states(model, tokens)
    with torch.no_grad():
        resid = model.hook_embed(model.embed(tokens))  # rotary models: no positional embedding added
        for layer, block in enumerate(model.blocks):
            normed = block.ln1(resid)
            attn = block.attn(normed, normed, normed)
            torch.testing.assert_close(got[(layer, "attn")], (resid + attn)[:, -1], rtol=1e-5, atol=1e-5)
            resid = resid + attn + block.mlp(block.ln2(resid))
            torch.testing.assert_close(got[(layer, "mlp")], resid[:, -1], rtol=1e-5, atol=1e-5)


def test_raw_decoding_is_plain_unembedding(model):
    tokens = random_tokens(4, 5, seed=6)
    state = lens_states(model, tokens)[(1, "attn")]
    expected = state @ model.W_U + model.b_U
    torch.testing.assert_close(decode_states(model, state, "raw"), expected, rtol=1e-5, atol=1e-5)
    expected_norm = manual_norm(model, state) @ model.W_U + model.b_U
    torch.testing.assert_close(decode_states(model, state), expected_norm, rtol=1e-4, atol=1e-4)


# --- metrics --------------------------------------------------------------------------------------
@pytest.mark.parametrize("decode", ["final_norm", "raw"])
def test_metrics_match_brute_force(model, decode):
    tokens = arith_tokens(7, seed=7)
    # Answers: numeric ids, some equal to what the model predicts at the last layer.
    answers = torch.tensor([3 + (int(a) + int(b)) % 27 for a, b in zip(tokens[:, 1] - 3, tokens[:, 3] - 3)])
    top_k = 5
    res = early_decode(model, tokens, answers=answers, numeric_values=NUMERIC, operator_ids=OPS,
                       decode=decode, top_k=top_k, batch_size=3, progress=False)
    assert res.tracked == ["operand1", "operand2", "operator1"]
    assert res.labels()[:3] == ["L0 attn", "L0 mlp", "L1 attn"]
    ref = reference_states(model, tokens)
    V = model.cfg.d_vocab
    for li in range(model.cfg.n_layers):
        for si, sub in enumerate(("attn", "mlp")):
            x = ref[(li, sub)]
            if decode == "final_norm":
                x = manual_norm(model, x)
            logits = (x @ model.W_U + model.b_U).tolist()
            for p in range(len(tokens)):
                lg = logits[p]
                z = sum(math.exp(v) for v in lg)
                probs = [math.exp(v) / z for v in lg]
                a = int(answers[p])
                order = sorted(range(V), key=lambda i: -lg[i])
                rank = sum(1 for i in range(V) if lg[i] > lg[a])
                first_num = next(i for i in order if i in NUMERIC)
                expected = {
                    "answer_prob": probs[a],
                    "answer_rank": rank,
                    "numeric_mass": sum(probs[i] for i in NUMERIC),
                    "top1_numeric": float(order[0] in NUMERIC),
                    "top10_numeric": sum(1 for i in order[:10] if i in NUMERIC) / 10,
                    "abs_error": abs(NUMERIC[first_num] - NUMERIC[a]),
                }
                for name, value in expected.items():
                    assert getattr(res, name)[p, li, si] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, p, li, sub)
                for ti, pos in enumerate((1, 3, 2)):
                    assert res.visible[p, li, si, ti] == float(int(tokens[p, pos]) in order[:top_k])
    # Summary rows: means and spreads over prompts.
    rows = res.rows(n_boot=200)
    assert len(rows) == 2 * model.cfg.n_layers
    for row in rows:
        li, si = row["layer"], ("attn", "mlp").index(row["sublayer"])
        for name in ("answer_prob", "numeric_mass", "abs_error", "answer_rank"):
            v = getattr(res, name)[:, li, si]
            assert row[name] == pytest.approx(float(np.mean(v)))
            assert row[f"{name}_std"] == pytest.approx(float(np.std(v)))
            assert row[f"{name}_ci_low"] <= row[name] + 1e-12 <= row[f"{name}_ci_high"] + 2e-12
        assert row["visible_operand1"] == pytest.approx(float(res.visible[:, li, si, 0].mean()))


def test_answer_values_override_and_unknown_values():
    model = build_default("gpt2", seed=2)
    tokens = arith_tokens(4, seed=8)
    answers = torch.tensor([35, 36, 3, 4])  # the first two are not numeric tokens
    res = early_decode(model, tokens, answers=answers, numeric_values=NUMERIC, progress=False)
    assert np.isnan(res.abs_error[:2]).all() and np.isfinite(res.abs_error[2:]).all()
    row = res.rows(n_boot=50)[0]
    assert row["abs_error"] == pytest.approx(float(res.abs_error[2:, 0, 0].mean()))
    res2 = early_decode(model, tokens, answers=answers, answer_values=[100, 100, 100, 100],
                        numeric_values=NUMERIC, progress=False)
    top_num = res2.abs_error  # |value - 100| with values <= 26
    assert (top_num >= 74).all() and (top_num <= 100).all()


# --- tokenizer-based inputs -----------------------------------------------------------------------
def tiny_tokenizer_model(arch: str = "gpt2"):
    """A random model with a word-level tokenizer that splits integers into single digits (like Llama)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<pad>": 1, "<unk>": 2}
    for t in [str(i) for i in range(10)] + ["+", "-", "=", "Ġ42", "x"]:
        vocab[t] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Punctuation()])
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<bos>", pad_token="<pad>",
                                  unk_token="<unk>", name_or_path="tiny-digits")
    if BACKENDS[0] == "bridge":  # TransformerLens 4.x: the tokenizer is attached when the bridge is built
        from interventions import bridge_from_hooked_state
        from interventions.tokenization import prepare_tokenizer

        return bridge_from_hooked_state(*hooked_state(arch, seed=3), prepare_tokenizer(tok)).eval(), vocab
    model = build_default(arch, seed=3)
    model.tokenizer = tok
    model.cfg.tokenizer_prepends_bos = False
    return model, vocab


SMALL_PROMPTS, SMALL_VALUES = ["3+4=", "2+5=", "6-1=", "8-8="], [7, 7, 5, 0]


def small_lens_case(arch: str = "gpt2"):
    """:func:`tiny_tokenizer_model` decoding four prompts: ``(model, tokens, answers, result)``, ``result`` the
    :func:`circuits.lens.early_decode` of :data:`SMALL_PROMPTS` (answers :data:`SMALL_VALUES`)."""
    model, vocab = tiny_tokenizer_model(arch)
    tokens = model.to_tokens(SMALL_PROMPTS)
    answers = torch.tensor([vocab[str(v)] for v in SMALL_VALUES])
    result = early_decode(model, tokens, answers=answers, answer_values=SMALL_VALUES, prompts=SMALL_PROMPTS)
    return model, tokens, answers, result


def test_numeric_table_from_tokenizer_decodes_leading_space_tokens():
    model, vocab = tiny_tokenizer_model()
    table = numeric_table(model)
    expected = {vocab[str(i)]: i for i in range(10)} | {vocab["Ġ42"]: 42}
    assert {i: table.value(i) for i in range(model.cfg.d_vocab) if table.mask[i]} == expected
    assert table.operators == {vocab["+"]: "+", vocab["-"]: "-"}
    bare = build_default("gpt2")
    bare.tokenizer = None  # a bridge always carries one (a placeholder word-level tokenizer)
    with pytest.raises(ValueError, match="no tokenizer"):
        numeric_table(bare)


def test_dataset_input_groups_layouts_and_rejects_multi_token_answers():
    model, vocab = tiny_tokenizer_model()
    ds = [{"prompt": "3+4=", "answer": 7}, {"prompt": "12+3=", "answer": 5}, {"prompt": "2+2=", "answer": 4}]
    res = early_decode(model, ds, progress=False)
    assert res.prompts == ["3+4=", "2+2=", "12+3="]  # largest layout first
    assert res.layout_lengths.tolist() == [5, 5, 6]
    assert res.answers.tolist() == [vocab["7"], vocab["4"], vocab["5"]]
    for p, prompt in enumerate(res.prompts):
        logits = model(model.to_tokens(prompt))[0, -1]
        assert res.answer_prob[p, -1, -1] == pytest.approx(float(logits.softmax(-1)[res.answers[p]]), rel=1e-5)
    with pytest.raises(ValueError, match=r"answer 12 is not a single token.*\['1', '2'\]"):
        early_decode(model, [{"prompt": "3+9=", "answer": 12}], progress=False)
    with pytest.raises(ValueError, match="not a single token"):
        early_decode(model, model.to_tokens(["3+9="]), answers=["12"], progress=False)


def test_mixed_layout_is_rejected():
    model, _ = tiny_tokenizer_model()
    with pytest.raises(ValueError, match=r"mixed layout: token lengths \[5, 6\]"):
        early_decode(model, ["3+4=", "12+3="], answers=[7, 5], progress=False)
    m = build_default("llama")
    with pytest.raises(ValueError, match="mixed layout"):
        early_decode(m, [torch.tensor([0, 3, 30, 4]), torch.tensor([0, 3, 30, 4, 32])], answers=torch.tensor([5, 6]),
                     numeric_values=NUMERIC, progress=False)


# --- interchange ----------------------------------------------------------------------------------
def test_interchange_with_same_prompt_changes_nothing(model):
    tokens = arith_tokens(6, seed=9)
    answers = model(tokens)[:, -1].argmax(-1)
    res = interchange(model, tokens, answers, tokens.clone(), counter_answers=answers, progress=False)
    np.testing.assert_allclose(res.drop, 0.0, atol=1e-6)
    assert all(r["drop"] == pytest.approx(0.0, abs=1e-6) and r["answer_top1"] == 1.0 for r in res.rows())


def test_interchange_matches_independent_hook_patch(model):
    tokens = arith_tokens(8, seed=10)
    counter = tokens.clone()
    counter[:, 2] = 61 - counter[:, 2]  # flip the operator: same layout
    answers = model(tokens)[:, -1].argmax(-1)
    counter_answers = model(counter)[:, -1].argmax(-1)
    res = interchange(model, tokens, answers, counter, counter_answers=counter_answers, batch_size=3, progress=False)
    _, cache = model.run_with_cache(counter)
    clean = model(tokens)[:, -1].softmax(-1)
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.hook_attn_out"

        def patch(act, hook):
            act[:, -1] = cache[name][:, -1]
            return act

        probs = model.run_with_hooks(tokens, fwd_hooks=[(name, patch)])[:, -1].softmax(-1)
        exp_drop = (clean.gather(-1, answers[:, None]) - probs.gather(-1, answers[:, None]))[:, 0]
        np.testing.assert_allclose(res.drop[:, layer], exp_drop.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res.counter_prob[:, layer], probs.gather(-1, counter_answers[:, None])[:, 0].numpy(),
                                   rtol=1e-5, atol=1e-6)
        assert res.rows()[layer]["drop"] == pytest.approx(float(exp_drop.mean()), abs=1e-6)
    assert np.abs(res.drop).max() > 1e-3, "the flip should move the answer somewhere"
    with pytest.raises(ValueError, match="layout"):
        interchange(model, tokens, answers, counter[:, :4], progress=False)


def test_counterfactual_rows_and_layout_filter():
    spec = SimpleNamespace(template="{A}+{B}=", expression="A+B", operand_names=("A", "B"),
                           operand_ranges=((1, 12), (1, 9)), answer_min=2, answer_max=21)
    ds = [{"prompt": f"{a}+{b}=", "answer": a + b, "operands": [a, b], "task": "t"}
          for a, b in [(3, 4), (5, 2), (11, 3), (2, 2), (9, 9)]]
    rows = counterfactual_rows(ds, change="operand", index=1, seed=0, spec=spec)
    assert len(rows) == 5
    for r in rows:
        a, b = r["operands"]
        a2, b2 = r["counter_operands"]
        assert a2 == a and b2 != b and 1 <= b2 <= 9 and r["counter_answer"] == a + b2
        assert r["counter_prompt"] == f"{a}+{b2}="
    flips = counterfactual_rows(ds, change="operator", spec=spec)
    assert [(r["counter_prompt"], r["counter_answer"]) for r in flips] == [
        ("5-2=", 3), ("11-3=", 8), ("2-2=", 0), ("9-9=", 0)]  # 3-4 < 0 dropped
    assert parse_operands("If you subtract {B} from {A}, get ", ("A", "B"), "If you subtract 7 from 12, get ") == [12, 7]
    assert parse_operands("{A}+{B}=", ("A", "B"), "3-4=") is None
    with pytest.raises(ValueError, match="index=2 is out of range"):
        counterfactual_rows(ds, change="operand", index=2, spec=spec)

    model, vocab = tiny_tokenizer_model()
    cf = counterfactual_set(model, flips, label="operator")
    # Digit-split tokenizer: "11+3=" has another layout; answers 18 and 14 are two tokens: both dropped.
    assert cf.prompts == ["5+2=", "2+2="] and cf.counter_prompts == ["5-2=", "2-2="] and cf.n_dropped == 2
    assert cf.tokens.shape == cf.counter_tokens.shape == (2, 5)
    assert cf.answers.tolist() == [vocab["7"], vocab["4"]] and cf.counter_answers.tolist() == [vocab["3"], vocab["0"]]


# --- command and outputs --------------------------------------------------------------------------
def test_lens_command_writes_schema_and_offline_report(tmp_path, monkeypatch):
    import json

    from circuits import cli
    from circuits.prompts.sampling import Prompts

    model, vocab = tiny_tokenizer_model("llama")
    prompts = ["3+4=", "2+5=", "6-1=", "8-8=", "1+1="]
    values = [7, 7, 5, 0, 2]
    from circuits.models import loading
    from circuits.prompts import sampling

    monkeypatch.setattr(loading, "load_model", lambda name, device, backend=None, dtype=None: model)
    monkeypatch.setattr(loading, "zoo_names", lambda: ["tiny"])
    monkeypatch.setattr(sampling, "prepare_prompts", lambda m, task, n, seed, prepend_bos=None, **kw: Prompts(
        tokens=m.to_tokens(prompts[:n]), answers=torch.tensor([vocab[str(v)] for v in values[:n]]),
        prompts=prompts[:n], answer_values=values[:n], base_accuracy=0.14692982456140352, n_checked=2 * n,
        n_correct=n))
    out = tmp_path / "lens"
    assert cli.main(["lens", "--model", "tiny", "--task", "add", "--n-prompts", "4", "--out", str(out),
                     "--no-interchange"]) == 0
    doc = json.loads((out / "lens.json").read_text())
    assert doc["prompts"] == [{"prompt": p, "answer": v} for p, v in zip(prompts[:4], values)]
    assert doc["answer_tokens"] == [vocab[str(v)] for v in values[:4]]
    assert [(r["layer"], r["sublayer"]) for r in doc["rows"]] == [(l, s) for l in range(4) for s in ("attn", "mlp")]
    keys = {"answer_prob", "answer_rank", "numeric_mass", "top1_numeric", "top10_numeric", "abs_error"}
    assert all(keys <= set(r) for r in doc["rows"]) and doc["base_accuracy"] == 0.14692982456140352
    with torch.no_grad():
        final = model(model.to_tokens(prompts[:4]))[:, -1].softmax(-1)
    expected = float(np.mean([float(final[i, vocab[str(v)]]) for i, v in enumerate(values[:4])]))
    assert doc["rows"][-1]["answer_prob"] == pytest.approx(expected, rel=1e-5)
    page = (out / "report.html").read_text()
    import re

    assert "base_accuracy: 14.7%" in page and "0.1469" not in page  # the header rounds; lens.json keeps the number
    # offline: plotly.js in a file next to the report, shared by the reports of the directory
    assert re.search(r"<script src='plotly.min.js'>", page) and "plotly.js v" in (out / "plotly.min.js").read_text()
    assert page.count("Plotly.newPlot") >= 7  # 6 metrics + heatmap (+ visibility)
    assert cli.main(["lens", "--model", "tiny", "--task", "add", "--out", str(out), "--no-interchange"]) == 2


# --- zoo model ------------------------------------------------------------------------------------
def test_zoo_model_answer_is_top1_at_last_mlp_for_correct_prompts():
    zoo = pytest.importorskip("circuits.zoo")
    tasks = pytest.importorskip("circuits.tasks")
    if zoo.DEFAULT_MODEL not in zoo.available():
        pytest.skip(f"zoo model {zoo.DEFAULT_MODEL} is not trained yet")
    model = zoo.load(zoo.DEFAULT_MODEL)
    ds = tasks.frozen_set("add").select(range(40))
    res = early_decode(model, ds, batch_size=20, progress=False)
    assert res.n_prompts == 40 and res.tracked == ["operand1", "operand2", "operator1"]
    with torch.no_grad():
        logits = torch.cat([model(model.to_tokens(p))[:, -1] for p in res.prompts])
    correct = (logits.argmax(-1).numpy() == res.answers)
    assert correct.sum() >= 20, "the zoo model should answer most frozen add prompts"
    assert (res.answer_rank[correct, -1, -1] == 0).all()
    assert (res.answer_rank[~correct, -1, -1] > 0).all()
    np.testing.assert_allclose(res.abs_error[correct, -1, -1], 0.0)
    # The answer is not readable right after the first attention sub-layer.
    assert res.answer_rank[:, 0, 0].mean() > res.answer_rank[:, -1, -1].mean()


def test_the_tracked_token_chart_draws_a_bounded_number_of_lines():
    """A 2-shot prompt tracks every token of its examples: the chart draws the few most visible one by one and the
    mean of the rest, whatever their number."""
    from types import SimpleNamespace

    from circuits.lens.figures import MAX_TRACKED_LINES, REST_KEY, tracked_figure

    names = [f"t{i}" for i in range(16)]
    labels = [f"L{i} {s}" for i in range(3) for s in ("attn", "mlp")]
    rng = np.random.default_rng(0)
    share = {t: rng.uniform(0, 0.5, len(labels)) for t in names}
    share["t9"][4] = 0.99  # the most visible, somewhere in the middle
    rows = [{"label": lab, "sublayer": lab.split()[1], **{f"visible_{t}": float(share[t][i]) for t in names}}
            for i, lab in enumerate(labels)]
    rows[0]["visible_t3"] = None  # a token absent from every prompt at a row
    result = SimpleNamespace(tracked=names, top_k=10, sublayers=("attn", "mlp"), labels=lambda: labels)
    fig = tracked_figure(result, rows)
    assert len(fig.data) == 2 * (MAX_TRACKED_LINES + 1)  # post-attention and post-MLP per line
    peaks = {t: max(v for i, v in enumerate(share[t]) if not (i == 0 and t == "t3")) for t in names}
    top = sorted(names, key=lambda t: -peaks[t])[:MAX_TRACKED_LINES]
    drawn = [d.name.split(" (")[0] for d in fig.data]
    assert set(drawn) == {*top, f"mean of the other {len(names) - len(top)}"} and "t9" in drawn
    rest = [t for t in names if t not in top]
    mlp_rest = next(d for d in fig.data if d.name.startswith("mean") and "MLP" in d.name)
    for i, lab in enumerate(lab for lab in labels if lab.endswith("mlp")):
        want = np.mean([share[t][labels.index(lab)] for t in rest])
        assert mlp_rest.y[i] == pytest.approx(want)
    assert REST_KEY not in rows[0]  # the caller's rows are left as they are
    few = SimpleNamespace(tracked=names[:3], top_k=10, sublayers=("attn", "mlp"), labels=lambda: labels)
    assert len(tracked_figure(few, rows).data) == 6  # three tokens: each drawn, nothing averaged


def test_a_huge_operand_range_is_sampled_in_bounded_time():
    """Slots over 0..10^9 (a task file may declare them): the counterfactual is drawn, not enumerated; it has the
    same number of digits, another value, the task's answer, and the seed decides it."""
    import time

    from circuits.lens.counterfactual import same_digit_bounds

    spec = SimpleNamespace(template="{A}+{B}=", expression="A+B", operand_names=("A", "B"),
                           operand_ranges=((0, 10**9), (0, 10**9)), answer_min=0, answer_max=10**9)
    ds = [{"prompt": f"{a}+{b}=", "answer": a + b, "operands": [a, b], "task": "t"}
          for a, b in [(123456, 7), (5, 999_999_990), (400_000_000, 600_000_000)]]
    start = time.perf_counter()
    rows = counterfactual_rows(ds, change="operand", index=0, seed=3, spec=spec)
    assert time.perf_counter() - start < 2.0
    # the last row has no other A with A+B <= 10^9 but smaller ones: a same-width A below 4e8 qualifies
    assert [r["row"] for r in rows] == [0, 1, 2]
    for r in rows:
        a, b = r["operands"]
        a2, b2 = r["counter_operands"]
        assert b2 == b and a2 != a and len(str(a2)) == len(str(a)) and r["counter_answer"] == a2 + b <= 10**9
    assert rows == counterfactual_rows(ds, change="operand", index=0, seed=3, spec=spec)
    assert rows != counterfactual_rows(ds, change="operand", index=0, seed=4, spec=spec)
    # a row no draw can serve (B leaves no room under the bound for any other A) is dropped, not waited on
    tight = [{"prompt": "0+1000000000=", "answer": 10**9, "operands": [0, 10**9], "task": "t"}]
    assert counterfactual_rows(tight, change="operand", index=0, spec=spec) == []
    assert same_digit_bounds(7) == (0, 9) and same_digit_bounds(42) == (10, 99) and same_digit_bounds(-5) == (-9, -1)
    assert same_digit_bounds(-42) == (-99, -10)
