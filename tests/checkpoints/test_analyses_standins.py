"""The AF1 search, the necessity sweep and early decoding on stand-in checkpoints of real architectures.

Random models answer nothing, so the prompts' "answers" are the models' own top-1 tokens
(``standins.self_answered``, tests only). Checked against independent computations: the fast search
against the naive one (full forward pass per configuration), and the base model's own correctness.
"""

from __future__ import annotations

import pytest
import torch

from circuits.faithfulness import last_token_metrics
from circuits.lens import early_decode
from circuits.necessity import necessity_sweep
from circuits.search import configurations, search_af1
from interventions.types import InterventionError
from tests import standins
from tests.checkpoints.conftest import combos

N = 24


def _runs(key: str, backend: str) -> bool:
    """Whether the analyses can run: loadable (see test_loading_standins) and attention editable (the
    bridge's GPT-J attention is Hugging Face's own, which ignores pattern edits)."""
    return (backend == "bridge" or standins.STANDINS[key].hooked) and not (key == "gptj" and backend == "bridge")


def _prompts(model, task: str = "add"):
    return standins.self_answered(model, task, N, prepend_bos=True)


def _counts(result) -> dict:
    return {c.config: c.n_faithful for c in result.results}


@pytest.mark.parametrize("key,backend", combos())
def test_search_fast_equals_naive(key, backend, load_standin):
    if not _runs(key, backend):
        pytest.skip("combination not supported (tested below)")
    model = load_standin(key, backend)
    p = _prompts(model)
    fast = search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="fast", progress=False, n_boot=10)
    naive = search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="naive", progress=False, n_boot=10)
    assert fast.n_prompts == naive.n_prompts == N and fast.base_accuracy == 1.0
    assert _counts(fast) == _counts(naive)
    assert sorted(_counts(fast)) == sorted(configurations(model.cfg.n_layers))
    assert len(set(_counts(fast).values())) > 1  # the configurations differ: the test can see a mismatch


@pytest.mark.parametrize("key,backend", combos())
def test_necessity_and_early_decoding(key, backend, load_standin):
    if not _runs(key, backend):
        pytest.skip("combination not supported (tested below)")
    model = load_standin(key, backend)
    p = _prompts(model)
    nec = necessity_sweep(model, p.tokens, p.answers, progress=False, n_boot=10)
    assert [b.layer for b in nec.blocks] == list(range(model.cfg.n_layers)) and nec.n_prompts == N
    assert all(0.0 <= b.faithfulness <= 1.0 for b in nec.blocks)
    lens = early_decode(model, p.tokens, answers=p.answers, progress=False)
    assert lens.answer_rank.shape == (N, model.cfg.n_layers, 2)
    # The last block's output decoded through the final norm is the model's own output, whose top-1
    # token is the (self-)answer: rank 0 and the same probability as a plain forward pass.
    with torch.inference_mode():
        probs = model(p.tokens)[:, -1].float().softmax(-1).gather(-1, p.answers[:, None]).squeeze(-1)
    assert (lens.answer_rank[:, -1, -1] == 0).all()
    assert lens.answer_prob[:, -1, -1] == pytest.approx(probs.numpy(), abs=1e-4)


@pytest.mark.parametrize("key,backend", combos(["gptj"]))
def test_gptj_bridge_refuses_attention_edits(key, backend, load_standin):
    """TransformerLens runs GPT-J's Hugging Face attention in the bridge: edits of the pattern would be
    ignored, so the analyses stop with one line instead of reporting numbers of the unmodified model."""
    if backend != "bridge":
        pytest.skip("only the bridge wraps Hugging Face's GPT-J attention")
    model = load_standin(key, backend)
    p = _prompts(model)
    with pytest.raises(InterventionError, match=r"^this TransformerBridge wrapping GPTJForCausalLM ignores edits "
                                                r"returned at blocks\.\{l\}\.attn\.hook_pattern"):
        search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="naive", progress=False, n_boot=10)


@pytest.mark.parametrize("key,backend", combos(["gpt2", "pythia", "qwen2", "yi", "llama3", "gemma"]))
def test_search_in_bfloat16(key, backend, load_standin):
    """bfloat16 weights on CPU: the base check and metrics read float32 copies of the logits; the fast
    and the naive search agree to within one prompt per configuration (rounding of the shortcuts)."""
    if not _runs(key, backend):
        pytest.skip("combination not supported")
    model = load_standin(key, backend, "bfloat16")
    p = _prompts(model)
    with torch.inference_mode():
        logits = model(p.tokens)[:, -1]
    assert logits.dtype == torch.bfloat16
    correct, prob, diff = last_token_metrics(logits, p.answers)
    assert prob.dtype == diff.dtype == torch.float32 and bool(correct.all())
    assert torch.equal(prob, logits.float().softmax(-1).gather(-1, p.answers[:, None]).squeeze(-1))
    fast = _counts(search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="fast", progress=False, n_boot=10))
    naive = _counts(search_af1(model, p.tokens, p.answers, fit=p.fit, grid="full", method="naive", progress=False, n_boot=10))
    assert fast.keys() == naive.keys()
    assert max(abs(fast[c] - naive[c]) for c in fast) <= 1
