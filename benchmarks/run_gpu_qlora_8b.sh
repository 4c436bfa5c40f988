#!/usr/bin/env bash
# One call on a GPU machine without network: install the bitsandbytes wheel carried in .whl/,
# then run the QLoRA 8B benchmark; results.json, results.md and log.txt land in $OUT (or
# runs/bench-qlora-8b). Extra arguments go to benchmarks/gpu_qlora_8b.py.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/bitsandbytes-*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-runs/bench-qlora-8b}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt" || true
python3 benchmarks/gpu_qlora_8b.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
