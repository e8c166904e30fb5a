"""The local Hugging Face hub cache, read without the network: where it is, whether a repository or its weights
are in it and under which spelling, whether the libraries are told to stay offline, and whether TransformerLens
3.x would build a cached checkpoint from its own built-in config. Imports neither torch nor TransformerLens at
module level (the checks before loading use it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from circuits.errors import ModelLoadError

__all__ = ["cached_spelling", "check_builtin_config", "has_cached_weights", "hf_cache_dir", "in_hf_cache", "offline"]

TRUE = ("1", "true", "yes", "on")


def _hub_constants() -> Any:
    """``huggingface_hub.constants`` once something imported it (its values are then what the loaders use)."""
    return sys.modules.get("huggingface_hub.constants")


def offline() -> bool:
    """Whether the Hugging Face libraries are told not to use the network."""
    hc = _hub_constants()
    if hc is not None and getattr(hc, "HF_HUB_OFFLINE", False):
        return True
    return any(os.environ.get(k, "").strip().lower() in TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The local Hugging Face hub cache: ``huggingface_hub``'s own setting once it is imported, else
    ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    hc = _hub_constants()
    if hc is not None and getattr(hc, "HF_HUB_CACHE", None):
        return Path(hc.HF_HUB_CACHE).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def cache_folder(name: str) -> Path | None:
    cache = hf_cache_dir()
    if name.count("/") > 1 or not cache.is_dir():
        return None
    want = ("models--" + name.replace("/", "--")).lower()
    try:
        return next((p for p in cache.iterdir() if p.name.lower() == want), None)
    except OSError:
        return None


def in_hf_cache(name: str) -> bool:
    """Whether a snapshot of repository ``name`` is in the local cache (any letter case)."""
    folder = cache_folder(name)
    return folder is not None and any((folder / "snapshots").glob("*"))


CONFIG_FIELDS = (("d_model", "hidden_size"), ("n_layers", "num_hidden_layers"), ("d_vocab", "vocab_size"))


def config_cached(repo: str) -> bool:
    """Whether ``repo``'s ``config.json`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def has_cached_weights(repo: str) -> bool:
    """Whether ``repo``'s config and weights (``*.safetensors`` or ``*.bin``) are in the local Hugging Face
    cache, under exactly this spelling (no network access)."""
    from huggingface_hub import snapshot_download

    if not config_cached(repo):
        return False
    try:
        folder = Path(snapshot_download(repo, local_files_only=True))
    except (OSError, ValueError):  # LocalEntryNotFoundError: an incomplete snapshot counts as not cached
        return False
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def cached_spelling(name: str) -> str | None:
    """The spelling under which the weights of ``name`` are in the local Hugging Face cache, or ``None``.

    Tried in turn: ``name``; TransformerLens 3.x's official spelling (``EleutherAI/gpt-j-6b`` ->
    ``EleutherAI/gpt-j-6B``, aliases such as ``gpt2-small`` -> ``gpt2``); a cached repository whose name
    differs from either only in case (repository names on the hub are case-insensitive, cache folders are
    not). No network access. Loading the result works on the bridge; ``HookedTransformer`` (3.x) needs the
    official spelling cached (:func:`check_builtin_config` says so)."""
    from huggingface_hub import constants

    candidates = [name]
    try:
        from transformer_lens import loading_from_pretrained as lp

        candidates.append(lp.get_official_model_name(name))
    except (ImportError, AttributeError, ValueError):  # 4.x has no name table; unknown names keep theirs
        pass
    cache = Path(constants.HF_HUB_CACHE)
    folders = {p.name.lower(): p.name for p in cache.glob("models--*")} if cache.is_dir() else {}
    for spelling in list(candidates):
        folder = folders.get(("models--" + spelling.replace("/", "--")).lower())
        if folder is not None:
            candidates.append(folder[len("models--"):].replace("--", "/", 1))
    return next((c for c in dict.fromkeys(candidates) if has_cached_weights(c)), None)


def check_builtin_config(name: str) -> None:
    """Raise ``ValueError`` if ``HookedTransformer.from_pretrained(name)`` would ignore the checkpoint's
    own config: TransformerLens 3.x builds Llama and Gemma names from built-in configs (e.g. 4096 wide,
    32 blocks for ``meta-llama/Meta-Llama-3-8B``). When a ``config.json`` of ``name`` in the local
    Hugging Face cache disagrees (a fine-tune or a resized stand-in), loading would allocate the
    built-in size and then fail; ``backend="bridge"`` reads the checkpoint's config. Also raises when
    TransformerLens spells the name differently (``EleutherAI/gpt-j-6b`` -> ``EleutherAI/gpt-j-6B``) and
    only the given spelling is cached. No-op otherwise."""
    try:
        from huggingface_hub import try_to_load_from_cache
        from transformer_lens import loading_from_pretrained as lp

        official = lp.get_official_model_name(name)
    except (ImportError, AttributeError, ValueError):  # 4.x, or an unknown name: from_pretrained says so later
        return
    if official != name and config_cached(name) and not config_cached(official):
        raise ModelLoadError(f"HookedTransformer.from_pretrained looks up {name!r} as {official!r}, which is not in "
                             f"the local Hugging Face cache (only {name!r} is): download it under {official!r} or "
                             f"load it with backend='bridge' (--backend bridge)")
    if "llama" not in official.lower() and "gemma" not in official.lower():
        return
    path = try_to_load_from_cache(official, "config.json")
    if not isinstance(path, str):
        return
    try:
        built = lp.convert_hf_model_config(official)
    except (OSError, ValueError, KeyError, NotImplementedError):  # needs the hub (offline), or no such config
        return
    saved = json.loads(Path(path).read_text())
    saved = {**saved, **saved.get("text_config", {})}
    diff = [(a, built.get(a), saved.get(b)) for a, b in CONFIG_FIELDS if saved.get(b) not in (None, built.get(a))]
    if diff:
        said = ", ".join(f"{a} {x}" for a, x, _ in diff)
        has = ", ".join(f"{a} {y}" for a, _, y in diff)
        raise ModelLoadError(f"HookedTransformer.from_pretrained builds {name!r} from TransformerLens's built-in "
                             f"config ({said}), not from the checkpoint in the local cache ({has}): load it with "
                             f"backend='bridge' (--backend bridge)")
