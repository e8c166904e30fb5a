"""Edge attribution on the nnsight backend, which emulates TransformerLens's split inputs on the Hugging Face
blocks (:mod:`interventions.backends.nnsight_split`): on the zoo models, where the bridge wraps the same
checkpoint without weight processing, one pass with a random set of edges removed, its sender outputs and the
gradients at every receiver input equal the bridge's, which computes them with TransformerLens's own split
inputs. Covered: GPT-2's fused query/key/value projection, and a grouped-query Llama (rotary; key and value
inputs per key/value head)."""

from __future__ import annotations

import pytest
import torch

import interventions as iv
from circuits.edges import scores as sc
from circuits.edges.analysis import layout_of
from circuits.edges.engine import edge_pass
from circuits.prompts.sampling import prepare_prompts

pytest.importorskip("nnsight", reason="nnsight is not installed: pip install 'af1-circuits[nnsight]'")
zoo = pytest.importorskip("circuits.zoo")


def frozen(name: str, backend: str):
    model = zoo.load(name, backend=backend)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize("name", ["arith-gpt2", "arith-llama-gt-w1t2"])
def test_edge_pass_on_nnsight_equals_the_bridge(name):
    bridge, nn = frozen(name, "bridge"), frozen(name, "nnsight")
    p = prepare_prompts(bridge, "add", 6, progress=False)
    got = {}
    for model in (bridge, nn):
        ad = iv.adapt(model)
        layout = layout_of(ad.info, int(p.tokens.shape[1]), 1, True)
        gen = torch.Generator().manual_seed(3)
        removal = {s: (torch.rand(layout.shape(s), generator=gen) < 0.5).float() for s in layout.slots()}
        counter = edge_pass(ad, layout, p.tokens[sc.corrupted_rows(len(p.tokens))], p.answers).outputs
        got[model is nn] = (edge_pass(ad, layout, p.tokens, p.answers), edge_pass(
            ad, layout, p.tokens, p.answers, counter=counter, removal=removal, leaves=True))
    assert layout.grouped == (name == "arith-llama-gt-w1t2")
    (clean_b, cut_b), (clean_n, cut_n) = got[False], got[True]
    torch.testing.assert_close(clean_n.metric, clean_b.metric, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(clean_n.outputs, clean_b.outputs, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(cut_n.metric, cut_b.metric, atol=1e-4, rtol=1e-4)
    assert (cut_b.metric - clean_b.metric).abs().max() > 0.1  # the removed edges matter
    assert set(cut_n.grads) == set(cut_b.grads) == set(layout.slots())
    for slot, grad in cut_b.grads.items():
        scale = float(grad.abs().max()) + 1e-6
        torch.testing.assert_close(cut_n.grads[slot] / scale, grad / scale, atol=1e-4, rtol=0, msg=str(slot))


def test_split_inputs_switch_off_and_the_nnsight_model_reads_as_before():
    """Inside the edge pass the split points exist; after it, the model computes as before and its split
    flags are off again (``interventions.parts.split_inputs`` restores them)."""
    nn = frozen("arith-llama-gt-w1t2", "nnsight")
    p = prepare_prompts(nn, "add", 4, progress=False)
    with torch.no_grad():
        before = nn(p.tokens)
    ad = iv.adapt(nn)
    edge_pass(ad, layout_of(ad.info, int(p.tokens.shape[1]), 1, True), p.tokens, p.answers, leaves=True)
    assert not nn.cfg.use_split_qkv_input and not nn.cfg.use_hook_mlp_in and nn.split() is None
    with torch.no_grad():
        torch.testing.assert_close(nn(p.tokens), before, atol=0, rtol=0)
