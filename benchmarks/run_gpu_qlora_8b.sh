#!/usr/bin/env bash
# One call on a GPU machine without network, within BENCH_BUDGET_S seconds (default 450: a device
# call may take 8 minutes). Installs the wheels carried in .whl/ (bitsandbytes, and transformers /
# peft at the versions rlkit is tested with), runs two arms at tiny shapes on the GPU (seconds;
# catches a broken install before the 8B model is built), then the 8B arms of
# benchmarks/gpu_qlora_8b.py in the time left: it starts no arm it cannot finish, stops one still
# running at its deadline, and writes its tables either way. results.json, results.md, the dated
# gpu_qlora_8b_<gpu>_<date>.md (for benchmarks/results/) and log.txt land in $OUT (or
# runs/bench-qlora-8b); the tiny pass's under tiny/. Extra arguments go to the 8B run (e.g.
# --arm "rows=128 rollout.engine=hf_static rollout.compile=true", repeated).
set -uo pipefail
start=$(date +%s)
budget="${BENCH_BUDGET_S:-450}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-runs/bench-qlora-8b}"
mkdir -p "$out/tiny"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt" || true
if [ "${BENCH_TINY:-1}" = 1 ]; then  # BENCH_TINY=0 leaves its minute to the 8B arms
    python3 benchmarks/gpu_qlora_8b.py --tiny --out "$out/tiny" --budget-s 60 \
        --arm "rows=16 rollout.engine=hf" --arm "rows=16 rollout.engine=hf_static" \
        2>&1 | tee "$out/tiny/log.txt"
fi
# the arms' budget: what is left, less 30 s for Python's imports and the final tables
left=$((budget - ($(date +%s) - start) - 30))
# a hard stop 20 s after the arms' deadline, in case a CUDA call never returns to Python
timeout -s KILL $((left + 20)) python3 benchmarks/gpu_qlora_8b.py --out "$out" --budget-s "$left" \
    "$@" 2>&1 | tee "$out/log.txt"
