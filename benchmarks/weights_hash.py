"""Cost of the full-weights content hash (``interventions.weights.weights_sha256``) on an 8B checkpoint.

Builds a random-weight checkpoint of Llama-3-8B's shapes (32 blocks, width 4096, MLP 14336, 32 query and 8
key/value heads, vocabulary 128256: 8.03B parameters, 16.06 GB of bfloat16 safetensors, one shard per block)
in ``--dir`` (about 16 GB of disk), then times the hash the loader computes over its tensors, mapped from the
files (not copied: the machine needs no 16 GB of free memory), once, and the cached lookup after it. The
checkpoint is deleted afterwards unless ``--keep``. docs/reliability.md quotes the figure.

    python benchmarks/weights_hash.py --dir /tmp/llama8b
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import time
from pathlib import Path

import torch

V, D, L, H, KV, F = 128256, 4096, 32, 32, 8, 14336
"""Llama-3-8B: vocabulary, width, blocks, query heads, key/value heads, MLP width."""


def build(folder: Path) -> None:
    """The checkpoint (random normal weights times 0.02, norms 1), written shard by shard (one in memory)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    hd, n = D // H, L + 2
    index: dict[str, str] = {}

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def put(tensors: dict[str, torch.Tensor]) -> None:
        name = f"model-{len(set(index.values())) + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        index.update({k: name for k in tensors})

    ones = lambda: torch.ones(D, dtype=torch.bfloat16)  # noqa: E731
    put({"model.embed_tokens.weight": rnd(V, D)})
    for layer in range(L):
        p = f"model.layers.{layer}."
        put({p + "self_attn.q_proj.weight": rnd(H * hd, D), p + "self_attn.k_proj.weight": rnd(KV * hd, D),
             p + "self_attn.v_proj.weight": rnd(KV * hd, D), p + "self_attn.o_proj.weight": rnd(D, H * hd),
             p + "mlp.gate_proj.weight": rnd(F, D), p + "mlp.up_proj.weight": rnd(F, D),
             p + "mlp.down_proj.weight": rnd(D, F), p + "input_layernorm.weight": ones(),
             p + "post_attention_layernorm.weight": ones()})
    put({"model.norm.weight": ones(), "lm_head.weight": rnd(V, D)})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}, indent=1))


def mapped(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as a view of its memory-mapped file."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        with open(folder / shard, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        n = int.from_bytes(mm[:8], "little")
        for name, info in json.loads(mm[8 : 8 + n]).items():
            if name != "__metadata__":
                start, end = info["data_offsets"]
                out[name] = torch.frombuffer(mm, dtype=torch.bfloat16, count=(end - start) // 2,
                                             offset=8 + n + start).reshape(info["shape"])
    return out


def main() -> None:
    import warnings

    from interventions.weights import weights_sha256

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="folder for the checkpoint (about 16 GB)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    args = parser.parse_args()
    folder = Path(args.dir)
    t0 = time.perf_counter()
    build(folder)
    print(f"built {folder} in {time.perf_counter() - t0:.0f} s", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only buffer: the hash only reads it
        tensors = mapped(folder)

    class Mapped(torch.nn.Module):
        def state_dict(self, *a, **k):  # type: ignore[override]
            return dict(tensors)

    total = sum(t.numel() * t.element_size() for t in tensors.values())
    module = Mapped()
    t0 = time.perf_counter()
    digest = weights_sha256(module)
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert weights_sha256(module) == digest
    cached = time.perf_counter() - t0
    print(f"{len(tensors)} tensors, {sum(t.numel() for t in tensors.values()) / 1e9:.2f}B parameters, "
          f"{total / 1e9:.2f} GB: weights_sha256 {seconds:.1f} s ({total / 1e9 / seconds:.2f} GB/s, "
          f"{max(1, min(8, os.cpu_count() or 1))} threads), cached lookup {cached * 1e3:.1f} ms")
    if not args.keep:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
