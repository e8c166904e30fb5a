"""Pretrained models in a local Hugging Face model folder (``config.json``, weights, tokenizer files), e.g.
a converted GGUF checkpoint (:mod:`circuits.models.gguf`) or the output of ``save_pretrained``.

The bridge and nnsight backends load such a folder as they load a hub name
(:func:`circuits.models.loading.load_model`). TransformerLens 3.x's ``HookedTransformer.from_pretrained`` takes
only names of its official list, so :func:`load_hooked` builds the model here: the config from the
folder's own (:func:`circuits.zoo.hf.hooked_config`: GPT-2 and Llama, grouped-query attention, the
folder's rotary base and norm epsilon), the weights through TransformerLens's converters
(:func:`circuits.zoo.hf.hooked_state`; tied embeddings become an unembedding equal to the embedding's
transpose), processed as ``from_pretrained`` processes them (norm scales folded into the next weights,
writing weights and the unembedding centred, value biases folded). Its logits therefore equal the
folder's Hugging Face logits up to a constant per position (the centred unembedding), as the bridge's
compatibility mode does. Another architecture is refused in one line naming ``--backend bridge``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from interventions.types import Model

__all__ = ["is_model_folder", "load_hooked"]


def is_model_folder(source: str | os.PathLike) -> bool:
    """Whether ``source`` is a directory holding a ``config.json`` (a Hugging Face model folder)."""
    return (Path(source).expanduser() / "config.json").is_file()


def load_hooked(folder: str | os.PathLike, name: str, device: str = "cpu", dtype: Any = None,
                n_devices: int = 1) -> Model:
    """The ``HookedTransformer`` of the GPT-2 or Llama checkpoint in ``folder``, named ``name``, in eval mode:
    weights read and processed in float32, then cast to ``dtype`` (a torch dtype, ``None``: float32), on
    ``device`` (spread over ``n_devices`` GPUs when more than one). Raises
    :class:`~circuits.errors.ModelLoadError` naming the bridge for an architecture it cannot build."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from circuits.logs import quiet_to
    from circuits.zoo import hf as zoo_hf

    folder = Path(folder).expanduser()
    fields = zoo_hf.hooked_config(AutoConfig.from_pretrained(folder))  # refuses other architectures first
    hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = HookedTransformerConfig(**fields, model_name=name, device=device, n_devices=n_devices)
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(folder), move_to_device=False)
    model.load_and_process_state_dict(zoo_hf.hooked_state(hf_model, cfg), fold_ln=True, center_writing_weights=True,
                                      center_unembed=True, fold_value_biases=True)
    if dtype is not None:
        model = quiet_to(model, dtype)
    if n_devices > 1:
        model.move_model_modules_to_device()
    else:
        model = quiet_to(model, device)
    return model.eval()
