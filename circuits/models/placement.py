"""Where a large model's weights go: ``--device-map`` and ``--max-memory``.

* On the bridge (``TransformerBridge.boot_transformers``, TransformerLens 3.9 and 4.x) both are handed to
  Hugging Face's ``from_pretrained`` (accelerate dispatch): ``auto``/``balanced`` spread the blocks evenly
  over the GPUs, ``sequential`` fills GPU 0 first, a device name (``cpu``, ``cuda:1``) puts everything
  there; ``max_memory`` caps what each device receives. TransformerLens refuses maps that mix CPU and GPU
  (CPU offload) and disk offload.
* On hooked (``HookedTransformer.from_pretrained``) a map becomes ``n_devices``: the blocks are split
  evenly over that many GPUs (those named in ``max_memory``, else every visible one); the budgets of
  ``max_memory`` are not enforced there.
"""

from __future__ import annotations

import re
from typing import Any

from circuits.errors import ArgumentError

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""Dispatch strategies of ``--device-map`` (besides a device name such as ``cpu`` or ``cuda:1``)."""
SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$", re.IGNORECASE)


def check_device_map(value: str) -> str:
    """``value`` if it is a dispatch strategy (:data:`DEVICE_MAPS`) or a torch device name, else
    ``ValueError`` naming the valid values."""
    import torch

    if value in DEVICE_MAPS:
        return value
    try:
        torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        raise ArgumentError(f"--device-map {value!r} is not valid: use {', '.join(DEVICE_MAPS)} or a device such as "
                            f"cpu or cuda:0") from None
    return value


def parse_max_memory(text: str | dict | None) -> dict[int | str, str] | None:
    """``"0=70GiB,1=70GiB,cpu=100GiB"`` -> ``{0: "70GiB", 1: "70GiB", "cpu": "100GiB"}`` (GPU indices as
    ints, sizes as accelerate reads them: a number of bytes or a number with a unit such as ``GiB``). A
    dict (a sweep config's table) is checked the same way. ``ValueError`` naming the bad entry."""
    if text is None:
        return None
    items = list(text.items()) if isinstance(text, dict) else [
        tuple(part.split("=", 1)) if "=" in part else (part, "") for part in str(text).split(",") if part.strip()]
    out: dict[int | str, str] = {}
    for key, size in items:
        key, size = str(key).strip(), str(size).strip()
        if not SIZE.match(size) or not (key.isdigit() or key in ("cpu", "mps")):
            raise ArgumentError(f"--max-memory entry {key}={size!r} is not valid: give DEVICE=SIZE pairs separated by "
                                f"commas, DEVICE a GPU index or cpu, e.g. 0=70GiB,1=70GiB,cpu=100GiB")
        out[int(key) if key.isdigit() else key] = size
    if not out:
        raise ArgumentError("--max-memory is empty: give DEVICE=SIZE pairs, e.g. 0=70GiB,1=70GiB")
    return out


def hooked_n_devices(device_map: str | None, max_memory: dict[Any, Any] | None) -> int:
    """``n_devices`` of ``HookedTransformer.from_pretrained`` for a map: 1 without a map or for a device
    name, else the GPUs named in ``max_memory`` (else every visible GPU, at least 1)."""
    import torch

    if device_map is None or device_map not in DEVICE_MAPS:
        return 1
    gpus = [k for k in (max_memory or {}) if isinstance(k, int)]
    return max(1, len(gpus) if gpus else torch.cuda.device_count())
