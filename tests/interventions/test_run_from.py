"""Running blocks from a residual skips the blocks before ``start`` (capability ``skips_blocks``) and
honours explicit positions (capability ``positions``), on every architecture and backend."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

import interventions as iv
from tests.conftest import N_LAYERS, build_model, random_tokens


@contextmanager
def block_calls(model):
    """The list of block indices whose module ``model.blocks[i]`` is called, and of block indices whose
    ``blocks.{i}.hook_resid_pre`` fires, in call order, while the context is open."""
    calls: list[int] = []
    fired: list[int] = []
    handles = [block.register_forward_pre_hook(lambda m, args, i=i: calls.append(i))
               for i, block in enumerate(model.blocks)]
    ad = iv.adapt(model)
    hooks = [(f"blocks.{i}.hook_resid_pre", lambda act, hook=None, i=i: fired.append(i)) for i in range(N_LAYERS)]
    try:
        with ad.hooks(hooks):
            yield calls, fired
    finally:
        for h in handles:
            h.remove()


def test_run_from_runs_only_the_blocks_asked_for(model):
    """Every ``(start, stop)``: exactly blocks ``start..stop-1`` run, once each and in order, and the
    result is the full pass's residual (or logits). Fresh sequence lengths, so the inputs the blocks
    need are captured inside the counted region too."""
    ad = iv.adapt(model)
    assert ad.capabilities.skips_blocks
    for n_pos in (5, 9):
        tokens = random_tokens(3, n_pos, seed=60 + n_pos)
        logits, acts = model.run_with_cache(tokens)

        def entering(k):
            return acts[f"blocks.{k}.hook_resid_pre"] if k < N_LAYERS else acts[f"blocks.{N_LAYERS - 1}.hook_resid_post"]

        for start in range(N_LAYERS + 1):
            for stop in [None, *range(start + 1, N_LAYERS + 1)]:
                with torch.inference_mode(), block_calls(model) as (calls, fired):
                    out = ad.run_from(entering(start), start, stop)
                expected = list(range(start, N_LAYERS if stop is None else stop))
                assert calls == expected, (start, stop)
                assert fired == expected, (start, stop)
                ref = logits if stop is None else entering(stop)
                torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_embed_runs_no_block(model):
    tokens = random_tokens(2, 7, seed=61)
    _, acts = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    with torch.inference_mode(), block_calls(model) as (calls, fired):
        resid = iv.adapt(model).embed(tokens)
    assert calls == [] and fired == []
    torch.testing.assert_close(resid, acts["blocks.0.hook_resid_pre"], atol=1e-6, rtol=0)


def test_positions_place_rows_at_their_true_position(model, arch):
    """Rows ``[0, p]`` of a causal pass run at positions ``[0, p]`` give row ``p`` of the full pass when
    every query attends only to BOS and itself (computed independently by the full pass with those
    patterns edited). Rotary models differ from the unshifted run; learned positions are in the
    residual already, so positions change nothing there."""
    ad = iv.adapt(model)
    assert ad.capabilities.positions
    tokens = random_tokens(4, 7, seed=62)
    start, p = 1, 6
    peek = [iv.Peek(list(range(start, N_LAYERS)), mode="self", queries="all")]
    with torch.inference_mode():
        _, acts = model.run_with_cache(tokens, names_filter=f"blocks.{start}.hook_resid_pre")
        entering = acts[f"blocks.{start}.hook_resid_pre"]
        with iv.apply(model, peek):
            full = ad.run_from(entering, start)[:, p]
        pair = entering[:, [0, p]]
        with block_calls(model) as (calls, _):
            moved = ad.run_from(pair, start, positions=torch.tensor([0, p]))[:, 1]
        unmoved = ad.run_from(pair, start)[:, 1]
    assert calls == list(range(start, N_LAYERS))
    torch.testing.assert_close(moved, full, atol=1e-4, rtol=0)
    if arch == "gpt2":
        torch.testing.assert_close(unmoved, full, atol=1e-4, rtol=0)
    else:
        assert (unmoved - full).abs().max() > 1e-3


def test_positions_must_not_change_the_mask():
    """A model whose blocks would see a different attention mask for explicit positions is refused."""
    model = build_model("llama", "bridge")
    ad = iv.adapt(model)
    original = ad.capture_block_inputs

    def capture(n_pos, positions, device):
        args, kwargs = original(n_pos, positions, device)
        if positions is not None:  # what Hugging Face does when it reads position gaps as packed sequences
            kwargs = {**kwargs, "attention_mask": torch.zeros_like(kwargs["attention_mask"])}
        return args, kwargs

    ad.capture_block_inputs = capture
    resid = torch.zeros(1, 2, 32)
    with pytest.raises(RuntimeError, match=r"positions=\[0, 4\] changed the attention_mask.*without positions"):
        ad.run_from(resid, 0, positions=torch.tensor([0, 4]))


@pytest.mark.parametrize("arch", ["gpt2", "neox", "llama"])
def test_run_from_on_a_bridge_in_compatibility_mode(arch):
    """Pretrained models are loaded with ``enable_compatibility_mode()`` (folded LayerNorm, centred
    weights): the block modules called directly still give the full pass's logits."""
    model = build_model(arch, "bridge")
    model.enable_compatibility_mode()
    tokens = random_tokens(3, 6, seed=63)
    logits, acts = model.run_with_cache(tokens)
    ad = iv.adapt(model)
    torch.testing.assert_close(ad.embed(tokens), acts["blocks.0.hook_resid_pre"], atol=1e-6, rtol=0)
    for start in range(N_LAYERS):
        with block_calls(model) as (calls, _):
            out = ad.run_from(acts[f"blocks.{start}.hook_resid_pre"], start)
        assert calls == list(range(start, N_LAYERS))
        torch.testing.assert_close(out, logits, atol=1e-5, rtol=0)
