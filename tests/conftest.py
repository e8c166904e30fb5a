"""Tiny randomly initialised models of several architecture families and backends, shared by all tests.

Every architecture runs on every available backend: ``hooked`` (TransformerLens 3.x
``HookedTransformer``) where it can be imported, and ``bridge`` (``TransformerBridge``, TransformerLens
4.x or the 3.9 preview). Both backends of one ``(arch, seed)`` hold the same weights: the weights come
from :func:`hooked_state`, which reproduces ``HookedTransformer``'s own initialisation, and the bridge
is built from them with :func:`interventions.bridge_from_hooked_state`.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The test models are tiny: one intra-op thread is fastest and does not spin on a busy machine.
torch.set_num_threads(1)

ARCHS = ("gpt2", "neox", "gptj", "llama")
N_LAYERS = 4
D_VOCAB = 40


def has_hooked_transformer() -> bool:
    """Whether this TransformerLens still ships ``HookedTransformer`` (3.x; removed in 4.0)."""
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = ("hooked", "bridge") if has_hooked_transformer() else ("bridge",)
needs_hooked = pytest.mark.skipif(
    not has_hooked_transformer(), reason="needs HookedTransformer (transformer-lens 3.x)"
)


def arch_config(arch: str, n_layers: int = N_LAYERS, d_vocab: int = D_VOCAB, seed: int = 0) -> dict:
    """HookedTransformerConfig fields of a tiny model shaped like ``arch``."""
    base = dict(
        n_layers=n_layers, d_model=32, d_head=8, n_heads=4, d_mlp=64, n_ctx=16, d_vocab=d_vocab,
        act_fn="gelu", seed=seed, initializer_range=0.2, default_prepend_bos=True,
    )
    shapes = {
        "gpt2": dict(normalization_type="LN", positional_embedding_type="standard"),
        "neox": dict(normalization_type="LN", positional_embedding_type="rotary", rotary_dim=4,
                     parallel_attn_mlp=True),
        "gptj": dict(normalization_type="LN", positional_embedding_type="rotary", rotary_dim=4,
                     parallel_attn_mlp=True, rotary_adjacent_pairs=True),
        "llama": dict(normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=8,
                      gated_mlp=True, act_fn="silu", n_key_value_heads=2, final_rms=True),
    }
    return {**base, **shapes[arch]}


def hooked_state(arch: str, **kwargs) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(config fields, state_dict)`` of ``build_hooked(arch, **kwargs)``, without TransformerLens.

    Reproduces ``HookedTransformer(cfg)`` with ``init_mode="gpt2"``: ``torch.manual_seed(seed)``, then
    every ``W_*`` parameter drawn from N(0, initializer_range) in registration order; biases are 0
    and norm scales 1. (Checked against ``build_hooked`` where TransformerLens 3.x is installed.)
    """
    cfg = arch_config(arch, **kwargs)
    d, n, h, m, v = cfg["d_model"], cfg["n_heads"], cfg["d_head"], cfg["d_mlp"], cfg["d_vocab"]
    kv = cfg.get("n_key_value_heads") or n
    gqa = "_" if kv != n else ""
    ln = ("w",) if cfg["normalization_type"] == "RMS" else ("w", "b")
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed.W_E", (v, d))]
    if cfg["positional_embedding_type"] == "standard":
        shapes.append(("pos_embed.W_pos", (cfg["n_ctx"], d)))
    for layer in range(cfg["n_layers"]):
        p = f"blocks.{layer}."
        shapes += [(f"{p}ln{i}.{x}", (d,)) for i in (1, 2) for x in ln]
        shapes += [
            (p + "attn.W_Q", (n, d, h)), (p + "attn.W_O", (n, h, d)), (p + "attn.b_Q", (n, h)),
            (p + "attn.b_O", (d,)), (f"{p}attn.{gqa}W_K", (kv, d, h)), (f"{p}attn.{gqa}W_V", (kv, d, h)),
            (f"{p}attn.{gqa}b_K", (kv, h)), (f"{p}attn.{gqa}b_V", (kv, h)),
        ]
        if cfg.get("gated_mlp"):
            shapes += [(p + "mlp.W_in", (d, m)), (p + "mlp.W_out", (m, d)), (p + "mlp.W_gate", (d, m)),
                       (p + "mlp.b_in", (m,)), (p + "mlp.b_out", (d,))]
        else:
            shapes += [(p + "mlp.W_in", (d, m)), (p + "mlp.b_in", (m,)), (p + "mlp.W_out", (m, d)),
                       (p + "mlp.b_out", (d,))]
    shapes += [(f"ln_final.{x}", (d,)) for x in ln] + [("unembed.W_U", (d, v)), ("unembed.b_U", (v,))]
    torch.manual_seed(cfg["seed"])
    state = {}
    for name, shape in shapes:
        if "W_" in name:
            state[name] = torch.empty(shape).normal_(0.0, cfg["initializer_range"])
        else:
            state[name] = torch.ones(shape) if name.rsplit(".", 1)[-1] == "w" else torch.zeros(shape)
    return cfg, state


def build_hooked(arch: str, **kwargs):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    model = HookedTransformer(HookedTransformerConfig(**arch_config(arch, **kwargs)))
    return model.eval()


def build_bridge(arch: str, **kwargs):
    """The ``TransformerBridge`` with the weights of ``build_hooked(arch, **kwargs)``."""
    from interventions import bridge_from_hooked_state

    return bridge_from_hooked_state(*hooked_state(arch, **kwargs)).eval()


def build_model(arch: str, backend: str, **kwargs):
    """A tiny random model of ``arch`` on ``backend`` (``"hooked"`` or ``"bridge"``); kwargs as ``arch_config``."""
    if backend == "hooked":
        return build_hooked(arch, **kwargs)
    if backend == "bridge":
        return build_bridge(arch, **kwargs)
    raise ValueError(f"backend={backend!r} is not valid: choose 'hooked' or 'bridge'")


def build_default(arch: str, **kwargs):
    """``build_model`` on the first available backend: ``hooked`` on TransformerLens 3.x, ``bridge`` on 4.x."""
    return build_model(arch, BACKENDS[0], **kwargs)


@pytest.fixture(scope="session", params=ARCHS)
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def model(arch, backend):
    """A tiny random model of one architecture (``arch``) on one backend (``backend``): 4 blocks,
    vocab 40, BOS id 0. Both backends of an architecture hold the same weights."""
    torch.manual_seed(0)
    return build_model(arch, backend)


def random_tokens(n: int, n_pos: int, d_vocab: int = D_VOCAB, seed: int = 0, values: int | None = None):
    """``[n, n_pos]`` token ids with BOS (0) at position 0; positions >= 1 draw from ``values`` ids."""
    g = torch.Generator().manual_seed(seed)
    hi = d_vocab if values is None else values + 1
    toks = torch.randint(1, hi, (n, n_pos), generator=g)
    toks[:, 0] = 0
    return toks


def disjoint_fit_tokens(tokens: torch.Tensor, n: int = 400, seed: int = 99) -> torch.Tensor:
    """A fit set for the means of prompts ``tokens`` (from :func:`random_tokens` with a small ``values``):
    ``n`` further rows drawn from the same ids, without any row of ``tokens`` (the runner refuses a scored
    prompt inside the fit set)."""
    from interventions.coverage import row_digests

    values = int(tokens[:, 1:].max())
    fit = random_tokens(n, int(tokens.shape[1]), seed=seed, values=values)
    return fit[~torch.isin(row_digests(fit), row_digests(tokens))]


def use_prompts(monkeypatch, tokens: torch.Tensor, fit: torch.Tensor | None = None) -> None:
    """Make the commands' prompt preparation (:meth:`circuits.prompts.spec.PromptSpec.prepare`) return the first
    ``n_prompts`` rows of ``tokens`` with the model's own answers and, when the analysis needs means, the fit
    set ``fit`` (for random models, which no task fits)."""
    from dataclasses import replace

    from circuits.prompts.fitset import FitSet
    from circuits.prompts.sampling import self_answer_prompts
    from circuits.prompts.spec import PromptSpec

    def prepare(spec, model, *, means=None, progress=True, batch_size=128):
        prompts = self_answer_prompts(model, tokens[: spec.n_prompts], task=spec.task)
        return replace(prompts, fit=FitSet.given(fit, spec.fit.min_count) if means and fit is not None else None)

    monkeypatch.setattr(PromptSpec, "prepare", prepare)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (training-like loops run slower with more on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FORMER_PLANTED_SPEC = {"self_all": [0, 1, 2, 5], "last_full": [3, 4]}
"""The attention-mask spec of the former ``arith-gpt2-af1`` (wait 2, transfer 2, every head of blocks 3-4)."""


def planted_mask_folder(tmp_path) -> Path:  # noqa: F821
    """A copy of ``arith-gpt2``'s folder whose ``zoo.json`` records :data:`FORMER_PLANTED_SPEC` (a folder of the
    former mask-based kind, now that none is shipped)."""
    import json
    import shutil

    from circuits import zoo

    folder = tmp_path / "planted"
    shutil.copytree(zoo.model_dir("arith-gpt2"), folder)
    (folder / "zoo.json").write_text(json.dumps({"planted": FORMER_PLANTED_SPEC}))
    return folder


def zoo_float64_atol(card: dict) -> float:
    """Tolerance for the logits of one zoo model computed two ways (backends, plain transformers) in float64:
    the GPT-2 models agree to ~1e-13; the HookedTransformer's Llama path differs from Hugging Face's by
    1e-5..8e-5 in exact arithmetic too, so 1e-4 there. (In float32 the ground truths, whose forbidden
    attention scores sit far below the allowed ones, differ by up to 3.4e-4 from kernel rounding alone.)"""
    return 1e-4 if card["arch"] == "llama" else 1e-9


class ForwardStopped(Exception):
    """Raised by :func:`token_devices` to end a forward pass before it runs."""


@contextlib.contextmanager
def token_devices(model, device: str = "meta"):
    """Inside the block ``adapt(model).device()`` answers ``device`` and every forward pass of ``model`` stops at
    its start with :class:`ForwardStopped`; yields the list that collects the device of the token ids each
    pass was given. (A ``TransformerBridge`` does not move token ids to its weights' device itself, so its
    callers must; on a CPU-only machine the meta device stands in for a GPU.)"""
    from unittest import mock

    import interventions as iv

    seen: list = []

    def stop(module, args, kwargs):
        seen.append((args[0] if args else kwargs["input"]).device)
        raise ForwardStopped

    handle = model.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with mock.patch.object(type(iv.adapt(model)), "device", lambda self: torch.device(device)):
            yield seen
    finally:
        handle.remove()
