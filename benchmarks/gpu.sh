#!/usr/bin/env bash
# benchmarks/gpu.py on the GPU in one call, from any folder: writes "$OUT/gpu.json" (the figures, rewritten
# after every phase) and "$OUT/gpu.log" (what it printed). Installs nothing: torch (a CUDA build),
# transformers, tokenizers, safetensors, accelerate, transformer-lens, jaxtyping, einops and numpy must be
# importable by $PYTHON (default python3). Arguments are passed on, e.g. --time-limit 400.
set -euo pipefail
: "${OUT:?set OUT to the folder that receives gpu.json}"
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"${PYTHON:-python3}" benchmarks/gpu.py --out "$OUT/gpu.json" "$@" 2>&1 | tee "$OUT/gpu.log"
