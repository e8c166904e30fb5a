"""How each backend builds a model: a registry of loaders beside :func:`interventions.register_backend`.

:func:`interventions.register_backend` says how the interventions drive a model once it is built (its adapter);
:func:`register_loader` says how a backend builds one:

* ``pretrained(request)``: a pretrained model from a hub name or a local Hugging Face folder (a
  :class:`LoadRequest`, resolved by :func:`circuits.models.loading.load_model`: GGUF conversion, placement, dtype), and
* ``from_hf(hf_model, tokenizer, folder, b_U, device)``: a zoo model from the Hugging Face model and tokenizer of
  its folder (:func:`circuits.zoo.load_dir`; ``b_U``: the unembedding bias of a folder of the former format, else
  ``None``; ``device``: where the caller moves the model next).

:func:`circuits.models.loading.load_model` and :func:`circuits.zoo.load_dir` ask :func:`get_loader` and never test a
backend's name, so a new backend is its adapter module plus one :func:`register_loader` call (and its name in
:data:`interventions.vocab.BACKENDS`, the vocabulary the command line offers). The shipped loaders (``hooked``,
``bridge``, ``nnsight``) are registered below. Nothing here imports torch or TransformerLens until a model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from circuits.errors import ArgumentError
from interventions.types import Model, Tokenizer

__all__ = ["BackendLoader", "LoadRequest", "OffloadRefused", "get_loader", "loader_names", "register_loader",
           "remote_backends"]


@dataclass(frozen=True)
class LoadRequest:
    """A pretrained model to build, as :func:`circuits.models.loading.load_model` resolved it.

    ``source``: what the loader reads (a hub name, or a local folder when ``local``: a GGUF file's converted
    folder or the user's folder); ``name``: the model's name as given. ``device``: where its weights go;
    ``dtype``: a ``torch.dtype`` or ``None`` (the loader's default, float32). ``device_map``/``max_memory``
    (checked, see :mod:`circuits.models.placement`): spread the weights over several devices, replacing ``device``.
    ``remote``: run on NDIF."""

    source: str
    name: str
    local: bool
    device: str = "cpu"
    dtype: torch.dtype | None = None
    device_map: str | None = None
    max_memory: dict[int | str, str] | None = None
    remote: bool | str = False


@dataclass(frozen=True)
class BackendLoader:
    """How backend ``name`` builds a model (see the module docstring). ``label``/``local_label``: the call a
    loading failure names (a hub name / a local folder); ``remote``: can run on NDIF."""

    name: str
    pretrained: Callable[[LoadRequest], Any]
    from_hf: Callable[[PreTrainedModel, Tokenizer, Path, torch.Tensor | None, str], Model]
    label: str
    local_label: str
    remote: bool = False


class OffloadRefused(ValueError):
    """A device map left weights on the CPU or disk (accelerate offloading), which TransformerLens's weight
    processing cannot read: one of the loaders' known causes (:data:`circuits.models.loading.LOAD_FAILURES`)."""


_LOADERS: dict[str, BackendLoader] = {}


def register_loader(loader: BackendLoader) -> None:
    """Register (or replace) how backend ``loader.name`` builds models."""
    _LOADERS[loader.name] = loader


def get_loader(backend: str) -> BackendLoader:
    """The loader of ``backend``; :class:`~circuits.errors.ArgumentError` naming the registered ones otherwise."""
    try:
        return _LOADERS[backend]
    except KeyError:
        raise ArgumentError(f"no loader is registered for backend {backend!r}; registered: "
                            f"{', '.join(sorted(_LOADERS))} (circuits.models.loaders.register_loader)") from None


def loader_names() -> list[str]:
    """The backends a model can be loaded on, in registration order."""
    return list(_LOADERS)


def remote_backends() -> list[str]:
    """The backends that can run a model on NDIF."""
    return [name for name, loader in _LOADERS.items() if loader.remote]


# --- the shipped loaders ----------------------------------------------------------------------------------------
def _hooked_pretrained(r: LoadRequest) -> Model:
    device, n_devices = r.device, 1
    if r.device_map is not None:  # TransformerLens places blocks itself over n_devices GPUs
        import torch

        from circuits.models import placement

        n_devices = placement.hooked_n_devices(r.device_map, r.max_memory)
        gpu = "cuda" if torch.cuda.is_available() else "cpu"
        device = gpu if r.device_map in placement.DEVICE_MAPS else r.device_map
    if r.local:
        from circuits.models.local import load_hooked

        return load_hooked(r.source, r.name, device=device, dtype=r.dtype, n_devices=n_devices)
    from transformer_lens import HookedTransformer

    from circuits.models.hub import check_builtin_config

    check_builtin_config(r.name)
    kwargs: dict[str, Any] = {"device": device}
    if r.device_map is not None:
        kwargs["n_devices"] = n_devices
    if r.dtype is not None:
        kwargs["dtype"] = r.dtype
    return HookedTransformer.from_pretrained(r.name, **kwargs)


def _hooked_from_hf(hf_model: PreTrainedModel, tokenizer: Tokenizer, folder: Path, b_U: torch.Tensor | None,
                    device: str) -> Model:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuits.errors import ModelLoadError
    from circuits.zoo import hf

    cfg = HookedTransformerConfig(**hf.hooked_config(hf_model.config), model_name=folder.name, device=device)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    missing, unexpected = model.load_state_dict(hf.hooked_state(hf_model, cfg, b_U), strict=False)
    missing = [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    if missing or unexpected:
        raise ModelLoadError(f"weights of {folder.name!r} do not fit its config: missing {missing}, "
                             f"unexpected {unexpected}")
    return model


def _bridge_pretrained(r: LoadRequest) -> Model:
    from transformer_lens.model_bridge import TransformerBridge


    kwargs: dict[str, Any] = ({"device": None, "device_map": r.device_map, "max_memory": r.max_memory}
                              if r.device_map is not None else {"device": r.device})  # accelerate dispatch
    if r.dtype is not None:
        kwargs["dtype"] = r.dtype
    model = TransformerBridge.boot_transformers(r.source, **kwargs)
    try:
        model.enable_compatibility_mode()
    except RuntimeError as err:  # TransformerLens 4.x: weight processing cannot reach offloaded weights
        if r.device_map is None or "offload" not in str(err):
            raise
        raise OffloadRefused(str(err).split(". ")[0]) from err
    if r.dtype is not None:
        match_parameter_dtype(model, r.dtype)
    return model


def _with_bias(hf_model: PreTrainedModel, b_U: torch.Tensor | None) -> PreTrainedModel:
    """A Hugging Face model of a former-format zoo folder with its unembedding bias on ``lm_head``."""
    if b_U is not None:
        from interventions.convert import with_unembed_bias

        with_unembed_bias(hf_model, b_U)
    return hf_model


def _bridge_from_hf(hf_model: PreTrainedModel, tokenizer: Tokenizer, folder: Path, b_U: torch.Tensor | None,
                    device: str) -> Model:
    from interventions.backends.bridge import boot

    model = boot(_with_bias(hf_model, b_U), hf_model.config.model_type, tokenizer)
    model.cfg.default_prepend_bos = True
    return model


def _nnsight_pretrained(r: LoadRequest) -> Model:
    from interventions.backends.nnsight import from_pretrained, require_nnsight

    require_nnsight()  # without the extra: "cannot load ...: ... pip install 'af1-circuits[nnsight]'"
    return from_pretrained(r.source, device=r.device, dtype=r.dtype, remote=r.remote, device_map=r.device_map,
                           max_memory=r.max_memory)


def _nnsight_from_hf(hf_model: PreTrainedModel, tokenizer: Tokenizer, folder: Path, b_U: torch.Tensor | None,
                     device: str) -> Model:
    from interventions.backends.nnsight import wrap

    model = wrap(_with_bias(hf_model, b_U), tokenizer, folder.name)
    model.cfg.default_prepend_bos = True
    return model


register_loader(BackendLoader("hooked", _hooked_pretrained, _hooked_from_hf, label="HookedTransformer.from_pretrained",
                              local_label="circuits.models.local.load_hooked"))
register_loader(BackendLoader("bridge", _bridge_pretrained, _bridge_from_hf,
                              label="TransformerBridge.boot_transformers",
                              local_label="TransformerBridge.boot_transformers"))
register_loader(BackendLoader("nnsight", _nnsight_pretrained, _nnsight_from_hf, label="nnsight.TransformersModel",
                              local_label="nnsight.TransformersModel", remote=True))


def match_parameter_dtype(model: Model, dtype: torch.dtype) -> int:
    """Cast the floating-point parameters of ``model`` that are not in ``dtype`` to it; returns how many.

    TransformerLens's compatibility mode adds some folded parameters in float32 (e.g. the output bias
    of Qwen2 and GPT-J attention on 3.9), which breaks a bfloat16 forward pass ("self and mat2 must have
    the same dtype"). Buffers (rotary frequencies) keep their dtype."""
    n = 0
    for p in getattr(model, "parameters", lambda: ())():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
            n += 1
    return n
