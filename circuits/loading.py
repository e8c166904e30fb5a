"""Loading a model by name and building the evaluation prompts of a task (shared by the commands).

* :func:`load_model`: a zoo model (``circuits.zoo``) by its name, otherwise a HuggingFace /
  TransformerLens model name through ``HookedTransformer.from_pretrained`` (3.x) or
  ``TransformerBridge.boot_transformers`` + ``enable_compatibility_mode()`` (``backend="bridge"``, the
  default on 4.x); needs the weights locally or network access, fails with a clear message otherwise.
  A GGUF name or file (:mod:`circuits.gguf`) and a local Hugging Face folder
  (:mod:`circuits.local_models`) load the same way, offline.
* :func:`prepare_prompts` (from :mod:`circuits.prompts`): prompts of a task that the model answers
  correctly, sampled in rounds, in one layout (token length; CAMA needs aligned positions).

Conventions: BOS at position 0 when prepended (the model's default unless ``prepend_bos`` says
otherwise), the answer is the argmax of the float32 logits at position -1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from circuits import placement
from circuits.backend_loaders import LoadRequest, get_loader, remote_backends
from circuits.errors import AF1Error, ArgumentError, ModelLoadError

# Documented here (docs/prompts.md); circuits.specs draws every prompt set through loading.prepare_prompts,
# which tests replace with stand-ins.
from circuits.prompts import check_bos, prepare_prompts  # noqa: F401
from circuits.validation import check_choice
from circuits.vocab import DTYPES

__all__ = ["cached_spelling", "check_bos", "check_builtin_config", "has_cached_weights", "load_model",
           "match_parameter_dtype", "model_name", "prepare_prompts", "zoo_names"]

def zoo_names() -> list[str]:
    """Names of the zoo models, or ``[]`` when the zoo is not installed."""
    try:
        from circuits import zoo
    except ImportError:
        return []
    return list(zoo.available())


def load_model(name: str, device: str = "cpu", backend: str | None = None, dtype: str | None = None,
               device_map: str | None = None, max_memory: str | dict | None = None,
               remote: bool | str = False) -> Any:
    """The model called ``name`` on ``device``, in eval mode, on ``backend``, with weights in ``dtype``.

    ``backend``: ``"hooked"`` (``HookedTransformer``, TransformerLens 3.x), ``"bridge"``
    (``TransformerBridge``) or ``"nnsight"`` (the Hugging Face model in nnsight,
    :class:`interventions.backends.nnsight.NNsightModel`; zoo models with their unembedding bias);
    ``None`` picks ``"hooked"`` where it exists, else ``"bridge"`` (4.x).

    ``remote`` (``"nnsight"`` only): ``True`` runs every forward pass on NDIF (only the config and the
    tokenizer are read here; the API key comes from ``NDIF_API_KEY``); see ``docs/remote.md``.

    A zoo name (``circuits.zoo.available()``) loads the embedded zoo model. Any other name is a
    pretrained model (e.g. ``"gpt2"``, ``"meta-llama/Meta-Llama-3-8B"``): on ``"hooked"`` through
    ``HookedTransformer.from_pretrained``; on ``"bridge"`` through
    ``TransformerBridge.boot_transformers`` followed by ``enable_compatibility_mode()``, which applies
    the weight processing of 3.9's ``from_pretrained`` (folded LayerNorm, centred weights) so that
    logits and residual activations match it. Either needs the weights in the local Hugging Face cache
    or network access, and raises :class:`~circuits.errors.ModelLoadError` (a ``ValueError``) with the
    reason otherwise.

    A GGUF name (``"smollm2-135m-instruct"``, :data:`circuits.gguf.REGISTERED`) or a path ending in
    ``.gguf`` is first converted, once, into a Hugging Face folder of the conversion cache
    (:func:`circuits.gguf.resolve`); that folder, or any local Hugging Face model folder given as
    ``name``, loads on every backend: the bridge and nnsight read it as they read a hub name,
    ``"hooked"`` builds the model from the folder's config and weights
    (:func:`circuits.local_models.load_hooked`: GPT-2 and Llama; another architecture is refused naming
    the bridge). Its ``cfg.model_name`` is ``name``.

    ``dtype`` (one of :data:`circuits.vocab.DTYPES`, ``None``: the loader's default, float32) applies to pretrained
    models, e.g. ``"bfloat16"`` for Llama-3-8B on a GPU; zoo models ship in float32 only.

    ``device_map`` (``"auto"``, ``"balanced"``, ``"sequential"`` or a device name; replaces ``device``) and
    ``max_memory`` (``{0: "70GiB", "cpu": "100GiB"}`` or ``"0=70GiB,cpu=100GiB"``, needs ``device_map``)
    spread a pretrained model over several devices: on the bridge through Hugging Face/accelerate dispatch,
    on hooked as ``n_devices`` (see :mod:`circuits.placement`).
    """
    import torch

    import interventions as iv
    from circuits import gguf, local_models

    backend = iv.resolve_backend(backend)
    loader = get_loader(backend)
    if dtype is not None:
        check_choice("dtype", dtype, DTYPES)
    if remote and not loader.remote:
        raise ArgumentError(f"remote={remote!r} needs backend={' or '.join(map(repr, remote_backends()))} (remote "
                            f"runs go through nnsight to NDIF)")
    if remote and device_map is not None:
        raise ArgumentError("device_map places weights here; a remote model's weights stay on NDIF: drop device_map")
    if device_map is not None:
        device_map = placement.check_device_map(device_map)
    max_memory = placement.parse_max_memory(max_memory)
    if max_memory is not None and device_map is None:
        raise ArgumentError("max_memory (--max-memory) needs device_map (--device-map auto, balanced or sequential)")
    names = zoo_names()
    if names and name not in names:
        from circuits import zoo

        if name in zoo.ALIASES:  # a deprecated zoo name: load its replacement (FutureWarning)
            name = zoo.resolve(name)
    if not remote:  # a name that can only be a mistake fails now, without the network
        from circuits.model_names import check_model_name

        check_model_name(name, names)
    if name in names and remote:
        raise ArgumentError(f"zoo model {name!r} is not hosted on NDIF: load it without remote")
    if name in names:
        from circuits import zoo

        if dtype not in (None, "float32"):
            raise ArgumentError(f"zoo model {name!r} ships in float32; dtype={dtype!r} applies to pretrained models")
        if device_map is not None:
            raise ArgumentError(f"zoo model {name!r} is small: device_map applies to pretrained models; use device")
        # name and backend are resolved above: load the folder (zoo.load would resolve both again)
        return zoo.load_dir(zoo.MODELS_DIR / name, device=device, backend=backend).eval()
    if remote and (gguf.is_gguf(name) or local_models.is_model_folder(name)):
        raise ModelLoadError(f"{name!r} is a local checkpoint, which NDIF does not host: load it without remote")
    source = gguf.resolve(name)  # a GGUF name or file: its converted folder (once); else name itself
    local = local_models.is_model_folder(source)
    request = LoadRequest(source=str(source), name=name, local=local, device=device,
                          dtype=None if dtype is None else getattr(torch, dtype), device_map=device_map,
                          max_memory=max_memory, remote=remote)
    from circuits.logs import quiet_stdout

    try:
        with quiet_stdout():  # TransformerLens's "Loaded pretrained model ...", "Moving model to device" lines
            model = loader.pretrained(request)
    except AF1Error:
        raise
    except LOAD_FAILURES as err:  # the loaders' known causes; anything else is a bug and surfaces as itself
        zoo_hint = f"zoo models: {', '.join(names)}" if names else "the model zoo is not installed"
        first = str(err).splitlines()[0] if str(err) else ""
        raise ModelLoadError(
            f"cannot load model {name!r}: it is not a zoo model ({zoo_hint}) and "
            f"{loader.local_label if local else loader.label} failed ({type(err).__name__}: {first}); "
            f"{load_fix(err, source, local, device_map)}"
        ) from err
    if local:
        model.cfg.model_name = name
    return model.eval()



LOAD_FAILURES: tuple[type[Exception], ...] = (OSError, ImportError, ValueError, NotImplementedError)
"""How the loaders (TransformerLens, transformers, huggingface_hub, accelerate, nnsight) report the causes a user
can fix: missing files and offline cache misses (``OSError``; huggingface_hub's ``LocalEntryNotFoundError`` and
``RepositoryNotFoundError`` are ones), a missing optional package (``ImportError``), an unknown name, model type
or architecture, a device map that would offload (``ValueError``; :class:`~interventions.InterventionError` is
one), an architecture a backend does not build (``NotImplementedError``). :func:`load_model` turns these into
:class:`~circuits.errors.ModelLoadError` naming the fix; any other exception (``TypeError``, ``KeyError``,
``AttributeError``, out of memory, ...) is not a loading problem of the user's and propagates unchanged."""


def load_fix(err: BaseException, source: Any, local: bool, device_map: str | None) -> str:
    """What to do about the loading failure ``err`` (one of :data:`LOAD_FAILURES`) of ``source``."""
    if isinstance(err, ImportError):
        return "install the package the error names (e.g. pip install 'af1-circuits[nnsight]')"
    if device_map is not None:
        return ("with a device map the model must fit on the GPUs (or all on the CPU) within max_memory: "
                "TransformerLens refuses disk and CPU offload")
    if local:
        return f"{source} must be a Hugging Face model folder that transformers can load"
    if isinstance(err, (ValueError, NotImplementedError)) and not isinstance(err, OSError):
        return ("check the name (a zoo model, a Hugging Face repository or a local folder); an architecture this "
                "backend does not build may load with another --backend; pretrained models need their weights in "
                "the local Hugging Face cache or network access")
    return "pretrained models need their weights in the local Hugging Face cache or network access"


def match_parameter_dtype(model: Any, dtype: Any) -> int:
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


CONFIG_FIELDS = (("d_model", "hidden_size"), ("n_layers", "num_hidden_layers"), ("d_vocab", "vocab_size"))


def _cached(repo: str) -> bool:
    """Whether ``repo``'s ``config.json`` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def has_cached_weights(repo: str) -> bool:
    """Whether ``repo``'s config and weights (``*.safetensors`` or ``*.bin``) are in the local Hugging Face
    cache, under exactly this spelling (no network access)."""
    from huggingface_hub import snapshot_download

    if not _cached(repo):
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
    import json

    try:
        from huggingface_hub import try_to_load_from_cache
        from transformer_lens import loading_from_pretrained as lp

        official = lp.get_official_model_name(name)
    except (ImportError, AttributeError, ValueError):  # 4.x, or an unknown name: from_pretrained says so later
        return
    if official != name and _cached(name) and not _cached(official):
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


def model_name(model: Any, default: str = "model") -> str:
    """A printable name of ``model`` (its config's ``model_name``)."""
    return str(getattr(getattr(model, "cfg", None), "model_name", None) or default)
