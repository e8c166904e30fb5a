"""Embedded model zoo: small transformers trained on the arithmetic tasks, shipped with the package.

>>> from circuits import zoo
>>> model = zoo.load("arith-gpt2")          # HookedTransformer, eval mode, offline, BOS at position 0
>>> model.to_str_tokens("42+20-15=")        # ['<bos>', '42', '+', '20', '-', '15', '=']

Each model lives in ``circuits/zoo/models/<name>/``: ``model.safetensors`` (fp32 weights),
``config.json`` (keyword arguments of :class:`transformer_lens.HookedTransformerConfig`),
``tokenizer.json`` (a :mod:`tokenizers` WordLevel tokenizer, every integer 0..520 one token) and
``card.json`` / ``card.md`` (training data, steps, wall time, seed, frozen-set accuracies).
Retrain with ``af1 zoo train NAME`` (see :mod:`circuits.zoo.train`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interventions.adapter import resolve_backend

if TYPE_CHECKING:  # pragma: no cover
    from transformer_lens import HookedTransformer

__all__ = ["available", "load", "load_dir", "card", "model_dir", "DEFAULT_MODEL", "MODELS_DIR"]

MODELS_DIR = Path(__file__).resolve().parent / "models"
DEFAULT_MODEL = "arith-gpt2"
"""The GPT-2-like model (LayerNorm, learned positions, GELU MLP) trained on the six Original tasks."""


def available() -> list[str]:
    """Names of the models shipped in the package (those with weights on disk), sorted."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "model.safetensors").exists())


def model_dir(name: str) -> Path:
    """Folder of model ``name``; ``ValueError`` listing the available names if unknown."""
    names = available()
    if name not in names:
        raise ValueError(f"unknown zoo model {name!r}; available models: {', '.join(names) or '(none)'}")
    return MODELS_DIR / name


def card(name: str) -> dict:
    """The model card of ``name`` (parsed ``card.json``): architecture config, training data, steps,
    wall time (seconds), seed and per-task accuracy on the frozen evaluation sets (fractions in [0, 1])."""
    return json.loads((model_dir(name) / "card.json").read_text())


def load(name: str = DEFAULT_MODEL, device: str = "cpu", backend: str | None = None) -> "HookedTransformer":
    """Load zoo model ``name`` as a :class:`HookedTransformer` in eval mode on ``device``.

    ``backend="bridge"`` returns the same model as a TransformerLens ``TransformerBridge`` (equal
    logits to 1e-4; see ``docs/backends.md``); the default is ``"hooked"`` where TransformerLens still
    has ``HookedTransformer`` (3.x), else ``"bridge"`` (4.x).

    Works offline (nothing is downloaded): the tokenizer is a
    :class:`transformers.PreTrainedTokenizerFast` built from the model's ``tokenizer.json``; it
    prepends BOS, so ``model.to_tokens("42+20-15=")`` is ``[BOS, 42, +, 20, -, 15, =]`` and the answer
    is the argmax of the logits at the last position (decode it with ``model.to_string``).
    """
    return load_dir(model_dir(name), device=device, backend=backend)


def load_dir(folder: str | Path, device: str = "cpu", backend: str | None = None) -> Any:
    """:func:`load` for a model folder anywhere (``model.safetensors``, ``config.json``,
    ``tokenizer.json``), e.g. the ``--out`` folder of ``af1 zoo train``."""
    import torch
    from safetensors.torch import load_file

    from circuits.zoo.tokenizer import load_tokenizer

    backend = resolve_backend(backend)
    folder = Path(folder)
    name = folder.name
    if backend == "bridge":
        from interventions import bridge_from_hooked_state

        cfg_dict = json.loads((folder / "config.json").read_text())
        planted = cfg_dict.pop("planted", None)
        state = load_file(str(folder / "model.safetensors"))
        model = bridge_from_hooked_state(cfg_dict, state, load_tokenizer(folder / "tokenizer.json"))
        model = model.to(torch.device(device)).eval()
        return _with_planted_mask(model, planted)
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg_kwargs = json.loads((folder / "config.json").read_text())
    cfg_kwargs["device"] = device
    planted = cfg_kwargs.pop("planted", None)  # a planted attention mask (circuits.zoo.planted)
    cfg = HookedTransformerConfig(**cfg_kwargs)
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    if missing or unexpected:
        raise ValueError(f"weights of {name!r} do not fit its config: missing {missing}, unexpected {unexpected}")
    model.to(torch.device(device))
    model.eval()
    return _with_planted_mask(model, planted)


def _with_planted_mask(model: Any, planted: dict | None) -> Any:
    """Attach the planted attention mask recorded for a model (:mod:`circuits.zoo.mask`)."""
    if planted is not None:
        from circuits.zoo.mask import attach_planted_mask

        attach_planted_mask(model, planted)
    return model
