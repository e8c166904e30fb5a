"""Construction of an untrained zoo model: the ``HookedTransformer`` of a recipe, its number-feature
initialisation, and loading weights into it (including from a checkpoint with a shorter vocabulary).

Initialisation: random (seeded with the recipe's seed), except that the first 19 dimensions of every
number token's embedding row and unembedding column start as fixed Fourier features of its value
(periods 10, 100, 1000) plus its magnitude (:func:`init_number_features`); everything stays trainable.
Without this head start the number embeddings are learnt far more slowly than a CPU budget allows.
"""

from __future__ import annotations

import numpy as np

from circuits.errors import ModelLoadError
from circuits.validation import check_choice
from circuits.vocab import MODEL_CLASSES
from circuits.zoo.hf import is_hf
from circuits.zoo.tokenizer import MAX_NUMBER
from interventions.types import Model

__all__ = ["require_hooked", "new_model", "init_from_folder", "number_features", "digit_features",
           "init_number_features", "load_weights"]


def require_hooked(what: str, model: Model | None = None, hint: str = "") -> None:
    """:class:`~circuits.errors.EnvironmentMismatchError` (a ``RuntimeError``) saying what to do unless
    ``HookedTransformer`` exists (TransformerLens 3.x) and ``model`` (if given) is one; ``hint`` names a
    further way out (e.g. another model class)."""
    from interventions.adapter import resolve_backend

    hooked = resolve_backend(None) == "hooked"
    if hooked and model is not None:
        from transformer_lens import HookedTransformer

        hooked = isinstance(model, HookedTransformer)
    if not hooked:
        from circuits.errors import EnvironmentMismatchError

        raise EnvironmentMismatchError(
            f"{what} needs a HookedTransformer, which TransformerLens 4.0 removed: train in an environment "
            f"with transformer-lens>=3.9,<4 (the repository's .venv, `make demo` builds it){hint}; the trained "
            f"model then loads on 4.x with zoo.load(name, backend='bridge')")


def new_model(cfg, tokenizer, model_class: str | None = None):
    """An untrained model for ``cfg`` (a :class:`~circuits.zoo.recipes.TrainConfig`) with ``tokenizer``
    attached (``model.tokenizer``), seeded with ``cfg.seed`` and number-feature initialised.

    ``model_class`` (one of :data:`circuits.vocab.MODEL_CLASSES`; ``None``: ``"hooked"`` where ``HookedTransformer``
    exists, else ``"transformers"``): the ``HookedTransformer`` initialisation defines the shipped models;
    ``"transformers"`` builds ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` (:func:`circuits.zoo.hf.hf_config`)
    whose Llama gate/up biases are frozen at 0 so that it still converts to a ``HookedTransformer``."""
    import torch

    from interventions.adapter import resolve_backend

    if model_class is None:
        model_class = "hooked" if resolve_backend(None) == "hooked" else "transformers"
    check_choice("model_class", model_class, MODEL_CLASSES)
    if model_class == "hooked":
        require_hooked("training a zoo model", hint=" or train the Hugging Face model (model_class='transformers', "
                                                  "`af1 zoo train NAME --model-class transformers`)")
        from transformer_lens import HookedTransformer, HookedTransformerConfig

        torch.manual_seed(cfg.seed)
        model = HookedTransformer(HookedTransformerConfig(**cfg.model_config(len(tokenizer))), tokenizer=tokenizer)
    else:
        from transformers import AutoModelForCausalLM

        from circuits.zoo.hf import hf_config

        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(hf_config(cfg, tokenizer), attn_implementation="eager")
        for name, p in model.named_parameters():
            if name.endswith(("gate_proj.bias", "up_proj.bias")):  # no HookedTransformer counterpart
                p.requires_grad_(False).zero_()
        model.tokenizer = tokenizer
    if cfg.number_features:
        init_number_features(model, tokenizer, cfg.number_features)
    return model


def init_from_folder(model, folder) -> None:
    """Start ``model`` from the weights of the zoo model folder ``folder`` (e.g. ``arith-styles`` from
    ``arith-llama``): Hugging Face weights as they are, or converted for a ``HookedTransformer``
    (:func:`circuits.zoo.hf.hooked_state`; a folder of the former format gives it its unembedding bias, which
    a Hugging Face model has no place for)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from circuits.zoo import hf as _hf

    folder = Path(folder)
    if is_hf(model):
        load_weights(model, load_file(str(folder / _hf.WEIGHTS)), str(folder))
        return
    hf_model, b_U = _hf.load_hf(folder)
    load_weights(model, _hf.hooked_state(hf_model, model.cfg, b_U), str(folder))


def _fourier_columns(n: np.ndarray) -> np.ndarray:
    """Unscaled features of :func:`number_features`, ``[len(n), 21]``."""
    n = np.asarray(n, dtype=np.float64)[:, None]
    cols = []
    for period, ks in ((10, (1, 2, 3, 4)), (100, (1, 2, 3)), (1000, (1, 2))):
        for k in ks:
            cols += [np.cos(2 * np.pi * k * n / period), np.sin(2 * np.pi * k * n / period)]
    cols.append(n / MAX_NUMBER)
    return np.concatenate(cols, axis=1)


def number_features(values: np.ndarray) -> np.ndarray:
    """Fixed numeric features of integers, ``[len(values), 19]``: cos/sin of ``2*pi*k*n/T`` for period
    T=10 (k=1..4), T=100 (k=1..3), T=1000 (k=1..2) and ``n / MAX_NUMBER``, each column scaled to unit RMS
    over 0..MAX_NUMBER."""
    ref = _fourier_columns(np.arange(MAX_NUMBER + 1)).T.copy()  # one contiguous row per feature
    rms = np.array([np.sqrt(np.mean(c ** 2)) for c in ref])
    return _fourier_columns(values) / rms


def digit_features(values: np.ndarray) -> np.ndarray:
    """One-hot digits of integers, ``[len(values), 26]``: units (10), tens (10), hundreds (0..5)."""
    n = np.asarray(values, dtype=np.int64)
    out = np.zeros((len(n), 26))
    out[np.arange(len(n)), n % 10] = 1.0
    out[np.arange(len(n)), 10 + (n // 10) % 10] = 1.0
    out[np.arange(len(n)), 20 + np.minimum(n // 100, 5)] = 1.0
    return out * np.sqrt(26 / 3)  # unit RMS per used dimension budget


def init_number_features(model, tokenizer, kind: str = "fourier") -> None:
    """Initialisation only (all weights stay trainable): the first 19 dimensions of each number token's
    embedding and unembedding column get :func:`number_features` of its value, so training starts from
    number embeddings that already encode digits and magnitude instead of having to discover them.
    ``model`` is a ``HookedTransformer`` (``embed.W_E``/``unembed.W_U``) or a Hugging Face causal LM
    (input/output embeddings)."""
    import torch

    vocab = tokenizer.get_vocab()
    ids = [vocab[str(i)] for i in range(MAX_NUMBER + 1)]
    fn = {"fourier": number_features, "digits": digit_features}[kind]
    feats = torch.tensor(fn(np.arange(MAX_NUMBER + 1)), dtype=torch.float32)
    k = feats.shape[1]
    with torch.no_grad():
        if is_hf(model):  # both matrices are [vocab, d_model]
            model.get_input_embeddings().weight[ids, :k] = feats
            model.get_output_embeddings().weight[ids, :k] = feats
        else:
            model.embed.W_E[ids, :k] = feats
            model.unembed.W_U[:k, ids] = feats.T


def load_weights(model, weights: dict, what: str) -> None:
    """Load ``weights`` into ``model``; a tensor whose vocabulary axis is shorter (a vocabulary that grew
    at the end, e.g. 565 -> 566 tokens) fills the shared rows/columns and keeps the rest as initialised.
    ``ValueError`` (naming ``what``) for a tensor that does not fit."""
    own = model.state_dict()
    fitted = {}
    for k, v in weights.items():
        if k in own and own[k].shape != v.shape:
            if v.ndim != own[k].ndim or any(m > n for m, n in zip(v.shape, own[k].shape)):
                raise ModelLoadError(f"{what}: {k} has shape {tuple(v.shape)}, the model needs {tuple(own[k].shape)}")
            w = own[k].clone()
            w[tuple(slice(0, m) for m in v.shape)] = v
            v = w
        fitted[k] = v
    model.load_state_dict(fitted, strict=False)
