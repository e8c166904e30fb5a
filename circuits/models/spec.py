"""What model a run loads, as a value (:class:`ModelSpec`): built by the command line, the sweep config and the
Python API alike; ``ModelSpec.load()`` prints the memory estimate and loads the model::

    model = ModelSpec("arith-gpt2").load()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from circuits.prompts.spec import PromptSpec

__all__ = ["ModelSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: a zoo name, a pretrained name or a local folder (``name``), the backend
    (``"hooked"``, ``"bridge"``, ``"nnsight"``; ``None``: the default of the installed TransformerLens), the
    weight ``dtype`` (``None``: float32), the ``device`` or a ``device_map`` (with ``max_memory``), and
    ``remote`` (nnsight on NDIF)."""

    name: str
    backend: str | None = None
    dtype: str | None = None
    device: str = "cpu"
    device_map: str | None = None
    max_memory: Any = None
    remote: bool = False

    def load(self, *, estimate: PromptSpec | None = None, batch_size: int = 128, means: bool = True) -> Any:
        """The model, in eval mode. A pretrained model that runs here first prints the memory it will need
        (and, with ``means``, the cost of fitting its means) for the prompts of ``estimate`` in batches of
        ``batch_size``."""
        from circuits.models import loading, memory

        if self.remote:  # a remote model needs no memory here
            return loading.load_model(self.name, device=self.device, backend=self.backend, dtype=self.dtype,
                                      remote=True)
        if estimate is not None and estimate.task is not None:
            memory.print_estimate(self.name, self.dtype, estimate.task, estimate.n_prompts, batch_size,
                                  fit=estimate.fit if means else None, fmt=estimate.format)
        spread = {k: v for k, v in (("device_map", self.device_map), ("max_memory", self.max_memory)) if v is not None}
        return loading.load_model(self.name, device=self.device, backend=self.backend, dtype=self.dtype, **spread)
