"""Loading a model by name and building the evaluation prompts of a task (shared by the commands).

* :func:`load_model`: a zoo model (``circuits.zoo``) by its name, otherwise a HuggingFace /
  TransformerLens model name through ``HookedTransformer.from_pretrained`` (3.x) or
  ``TransformerBridge.boot_transformers`` + ``enable_compatibility_mode()`` (``backend="bridge"``, the
  default on 4.x); needs the weights locally or network access, fails with a clear message otherwise.
  A GGUF name or file (:mod:`circuits.models.gguf`) and a local Hugging Face folder
  (:mod:`circuits.models.local`) load the same way, offline.
* :func:`prepare_prompts` (from :mod:`circuits.prompts`): prompts of a task that the model answers
  correctly, sampled in rounds, in one layout (token length; CAMA needs aligned positions).

Conventions: BOS at position 0 when prepended (the model's default unless ``prepend_bos`` says
otherwise), the answer is the argmax of the float32 logits at position -1.
"""

from __future__ import annotations

from typing import Any

from circuits.errors import AF1Error, ArgumentError, ModelLoadError
from circuits.models import placement
from circuits.models.loaders import LoadRequest, get_loader, remote_backends
from circuits.validation import check_choice
from circuits.vocab import DTYPES
from interventions.types import Model

__all__ = ["load_model", "model_name", "zoo_names"]

def zoo_names() -> list[str]:
    """Names of the zoo models, or ``[]`` when the zoo is not installed."""
    try:
        from circuits import zoo
    except ImportError:
        return []
    return list(zoo.available())


def load_model(name: str, device: str = "cpu", backend: str | None = None, dtype: str | None = None,
               device_map: str | None = None, max_memory: str | dict | None = None,
               remote: bool | str = False) -> Model:
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

    A GGUF name (``"smollm2-135m-instruct"``, :data:`circuits.models.gguf.REGISTERED`) or a path ending in
    ``.gguf`` is first converted, once, into a Hugging Face folder of the conversion cache
    (:func:`circuits.models.gguf.resolve`); that folder, or any local Hugging Face model folder given as
    ``name``, loads on every backend: the bridge and nnsight read it as they read a hub name,
    ``"hooked"`` builds the model from the folder's config and weights
    (:func:`circuits.models.local.load_hooked`: GPT-2 and Llama; another architecture is refused naming
    the bridge). Its ``cfg.model_name`` is ``name``.

    ``dtype`` (one of :data:`circuits.vocab.DTYPES`, ``None``: the loader's default, float32) applies to pretrained
    models, e.g. ``"bfloat16"`` for Llama-3-8B on a GPU; zoo models ship in float32 only.

    ``device_map`` (``"auto"``, ``"balanced"``, ``"sequential"`` or a device name; replaces ``device``) and
    ``max_memory`` (``{0: "70GiB", "cpu": "100GiB"}`` or ``"0=70GiB,cpu=100GiB"``, needs ``device_map``)
    spread a pretrained model over several devices: on the bridge through Hugging Face/accelerate dispatch,
    on hooked as ``n_devices`` (see :mod:`circuits.models.placement`).
    """
    import torch

    import interventions as iv
    from circuits.models import gguf
    from circuits.models import local as local_models

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
        from circuits.models.names import check_model_name

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


def model_name(model: Model, default: str = "model") -> str:
    """A printable name of ``model`` (its config's ``model_name``)."""
    return str(getattr(getattr(model, "cfg", None), "model_name", None) or default)
