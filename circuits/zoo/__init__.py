"""Embedded model zoo: small transformers trained on the arithmetic tasks, shipped with the package.

>>> from circuits import zoo
>>> model = zoo.load("arith-gpt2")          # HookedTransformer, eval mode, offline, BOS at position 0
>>> model.to_str_tokens("42+20-15=")        # ['<bos>', '42', '+', '20', '-', '15', '=']

Each model lives in ``circuits/zoo/models/<name>/`` (:func:`path`), a standard Hugging Face checkpoint:
``config.json`` (``GPT2LMHeadModel`` or ``LlamaForCausalLM``), ``model.safetensors`` (fp32 weights),
``tokenizer.json`` + ``tokenizer_config.json`` (a :mod:`tokenizers` WordLevel tokenizer, every integer
0..520 one token), plus ``zoo.json`` (the planted structure, if any) and ``card.json`` / ``card.md``
(training data, steps, wall time, seed, frozen-set accuracies); see :mod:`circuits.zoo.hf`. Plain
``transformers.AutoModelForCausalLM.from_pretrained(path(name))`` gives the logits of :func:`load`.
Retrain with ``af1 zoo train NAME`` (see :mod:`circuits.zoo.train`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from circuits.errors import ModelLoadError

if TYPE_CHECKING:
    from interventions.types import Model  # torch is imported only where a model is

__all__ = ["available", "load", "load_dir", "card", "model_dir", "path", "resolve", "DEFAULT_MODEL", "MODELS_DIR",
           "ALIASES"]

MODELS_DIR = Path(__file__).resolve().parent / "models"
DEFAULT_MODEL = "arith-gpt2"
"""The GPT-2-like model (LayerNorm, learned positions, GELU MLP) trained on the six Original tasks."""


ALIASES = {"arith-gpt2-af1": "arith-gpt2-gt-w2t2"}
"""Former model names -> the model that replaces them. ``arith-gpt2-af1`` forced its AF1 structure with
permanent attention-mask hooks and was 20-66% accurate; the ground truth ``arith-gpt2-gt-w2t2`` has the same
planted configuration (wait 2, transfer 2), learned in ordinary weights (see ``docs/groundtruth.md``)."""


def resolve(name: str) -> str:
    """``name``, or the model that replaces it if it is a deprecated alias (:data:`ALIASES`) that is not
    installed under its own name; a ``FutureWarning`` says so."""
    if name in ALIASES and not (MODELS_DIR / name / "model.safetensors").exists():
        import warnings

        warnings.warn(f"zoo model {name!r} is deprecated and no longer shipped: loading {ALIASES[name]!r}, its "
                      f"replacement (same planted wait=2, transfer=2, learned in the weights; see "
                      f"docs/groundtruth.md)", FutureWarning, stacklevel=3)
        return ALIASES[name]
    return name


def available() -> list[str]:
    """Names of the models shipped in the package (those with weights on disk), sorted."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "model.safetensors").exists())


def model_dir(name: str) -> Path:
    """Folder of model ``name`` (deprecated aliases resolved, see :func:`resolve`); ``ValueError`` listing
    the available names if unknown."""
    name = resolve(name)
    names = available()
    if name not in names:
        raise ModelLoadError(f"unknown zoo model {name!r}; available models: {', '.join(names) or '(none)'}")
    return MODELS_DIR / name


def path(name: str) -> Path:
    """Folder of zoo model ``name`` (same as :func:`model_dir`): a Hugging Face checkpoint that
    ``transformers.AutoModelForCausalLM.from_pretrained`` loads as it is (see ``docs/zoo.md``)."""
    return model_dir(name)


def card(name: str) -> dict:
    """The model card of ``name`` (parsed ``card.json``): architecture config, training data, steps,
    wall time (seconds), seed and per-task accuracy on the frozen evaluation sets (fractions in [0, 1])."""
    return json.loads((model_dir(name) / "card.json").read_text())


def load(name: str = DEFAULT_MODEL, device: str = "cpu", backend: str | None = None) -> Model:
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


def load_dir(folder: str | Path, device: str = "cpu", backend: str | None = None) -> Model:
    """:func:`load` for a model folder anywhere (a Hugging Face checkpoint as written by
    :mod:`circuits.zoo.export`), e.g. the ``--out`` folder of ``af1 zoo train``.

    The backend's registered loader builds the model (:func:`circuits.models.loaders.get_loader`): ``"hooked"``
    converts the Hugging Face weights with TransformerLens' own converters (:func:`circuits.zoo.hf.hooked_state`);
    ``"bridge"`` wraps the Hugging Face model in a ``TransformerBridge``; ``"nnsight"`` wraps it in nnsight
    (:func:`interventions.backends.nnsight.wrap`). A planted attention mask recorded in ``zoo.json`` is attached
    either way.
    A folder of the former format, with ``unembed_bias.safetensors`` beside the checkpoint, loads with that
    bias on every backend and a ``FutureWarning`` (:func:`circuits.zoo.hf.load_hf`)."""
    import torch

    from circuits.zoo import hf as _hf
    from circuits.zoo.tokenizer import load_tokenizer
    from interventions.adapter import resolve_backend  # torch and TransformerLens: only to load a model

    backend = resolve_backend(backend)
    folder = Path(folder)
    hf_model, b_U = _hf.load_hf(folder)  # b_U: only in a folder of the former format
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    from circuits.models.loaders import get_loader

    model = get_loader(backend).from_hf(hf_model, tokenizer, folder, b_U, device)
    from circuits.logs import quiet_to

    model = quiet_to(model, torch.device(device)).eval()
    planted = _hf.read_meta(folder).get("planted")
    if planted is not None:
        from circuits.zoo.mask import attach_planted_mask

        attach_planted_mask(model, planted)
    return model
