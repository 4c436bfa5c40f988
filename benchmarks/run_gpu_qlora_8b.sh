#!/usr/bin/env bash
# One call on a GPU machine without network: install the wheels carried in .whl/ (bitsandbytes,
# and transformers / peft at the versions rlkit is tested with), run the benchmark at tiny shapes
# on the GPU (seconds; catches a broken install before the 8B models are built), then at 8B.
# results.json, results.md and log.txt land in $OUT (or runs/bench-qlora-8b); the tiny pass's
# under tiny/. Extra arguments go to the 8B run of benchmarks/gpu_qlora_8b.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-runs/bench-qlora-8b}"
mkdir -p "$out/tiny"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt" || true
python3 benchmarks/gpu_qlora_8b.py --tiny --out "$out/tiny" 2>&1 | tee "$out/tiny/log.txt"
python3 benchmarks/gpu_qlora_8b.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
