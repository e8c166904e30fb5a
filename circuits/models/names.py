"""What a model name is, found before anything heavy is imported or downloaded: a zoo model, a local folder
or GGUF file, a repository in the local Hugging Face cache, or a name only the hub could resolve.

:func:`check_model_name` refuses, in well under a second and without touching the network, a name that can
only be a mistake: offline (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) a name that is neither a zoo model,
a local path nor cached; online a name one typo away from a zoo model (``arith-lama``) that is not cached
either (the hub would be retried for a minute before failing). :func:`n_layers_of` reads the number of blocks
from the checkpoint's ``config.json`` (zoo, local folder or cache) without loading weights, so that
``--wait``/``--transfer`` are checked before the model loads. No torch, transformers or TransformerLens import.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from circuits.errors import close_names, did_you_mean
from circuits.models.hub import cache_folder, hf_cache_dir, in_hf_cache, offline
from interventions.types import JsonDict

__all__ = ["cached_config", "check_model_name", "close_names", "n_layers_of"]

LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
"""``config.json`` keys of the number of blocks (Llama/most, GPT-2, TransformerLens, GPT-NeoX style)."""


def cached_config(name: str) -> JsonDict | None:
    """The ``config.json`` of ``name``: a zoo model's, a local folder's or a cached snapshot's (``None``: none
    found here; nothing is downloaded)."""
    from circuits.zoo import ALIASES, MODELS_DIR

    candidates = [MODELS_DIR / ALIASES.get(name, name) / "config.json", Path(name).expanduser() / "config.json"]
    folder = cache_folder(name)
    if folder is not None:
        candidates += sorted((folder / "snapshots").glob("*/config.json"))
    for path in candidates:
        try:
            if path.is_file():
                obj = json.loads(path.read_text())
                if isinstance(obj, dict):
                    return obj
        except (OSError, ValueError):
            continue
    return None


def n_layers_of(name: str) -> int | None:
    """Blocks of model ``name`` from its ``config.json`` (``None`` when it is not here to read)."""
    cfg = cached_config(name)
    if cfg is None:
        return None
    if isinstance(cfg.get("text_config"), dict):  # multimodal checkpoints keep the language model's config inside
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k in LAYER_KEYS}}
    value = next((cfg[k] for k in LAYER_KEYS if isinstance(cfg.get(k), int)), None)
    return int(value) if value is not None else None


def _transformer_lens_knows(name: str) -> bool:
    """Whether TransformerLens's own model table names ``name`` (its aliases, e.g. ``gpt2-small``), read as text
    so that TransformerLens is not imported."""
    try:
        spec = find_spec("transformer_lens")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(list(spec.submodule_search_locations)[0])
    for rel in ("loading_from_pretrained.py", "supported_models.py"):
        try:
            text = (root / rel).read_text()
        except OSError:
            continue
        if f'"{name}"' in text or f"'{name}'" in text:
            return True
    return False


def custom_loader() -> bool:
    """Whether ``circuits.models.loading.load_model`` was replaced (an embedding application or a test that loads its
    own models): such a loader decides what a name means, so no name is refused before it runs."""
    mod = sys.modules.get("circuits.models.loading")
    fn = getattr(mod, "load_model", None) if mod is not None else None
    return fn is not None and getattr(fn, "__module__", None) != "circuits.models.loading"


def check_model_name(name: str, zoo_names: Sequence[str] | None = None) -> None:
    """:class:`~circuits.errors.ModelLoadError` (one line, listing the close zoo names) for a name that is
    neither a zoo model, a local folder or GGUF file nor in the local Hugging Face cache, when the hub cannot
    be asked (offline) or the name is a near-miss of a zoo name; nothing for any other name. A local model
    folder whose ``config.json`` asks for more weights than it holds is refused here too
    (:func:`circuits.zoo.hf.check_size`, a ``ValueError`` naming the file and its size fields)."""
    from circuits.errors import ModelLoadError

    if zoo_names is None:
        from circuits import zoo

        zoo_names = zoo.available()
        aliases = zoo.ALIASES
    else:
        aliases = {}
    if name in zoo_names or name in aliases:
        return
    from circuits.models import gguf

    if (Path(name).expanduser() / "config.json").is_file():  # a model folder: its config must fit its weights
        from circuits.zoo.hf import check_size

        check_size(Path(name).expanduser())
    if gguf.is_gguf(name) or Path(name).expanduser().exists() or in_hf_cache(name):
        return
    near = close_names(name, zoo_names, cutoff=0.8)
    if not offline() and ("/" in name or not near):
        return  # a hub name: the loader downloads it
    if _transformer_lens_knows(name):
        return  # a TransformerLens alias (gpt2-small): cached under its hub name, which the loader resolves
    hint = did_you_mean(name, near) if near else did_you_mean(name, zoo_names)
    where = ("offline (HF_HUB_OFFLINE), so nothing can be downloaded" if offline() else
             "and it is one typo away from a zoo model (the hub is not asked)")
    raise ModelLoadError(
        f"cannot load model {name!r}: it is not a zoo model, a local folder or .gguf file, nor in the local Hugging "
        f"Face cache ({hf_cache_dir()}), {where}; {hint}zoo models: {', '.join(zoo_names) or '(none)'}"
    )
