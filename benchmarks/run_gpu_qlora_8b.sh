#!/usr/bin/env bash
# One call on a bare GPU machine without network, within BENCH_BUDGET_S seconds (default 450: a
# device call may take 8 minutes). Installs the wheels carried in .whl/ (bitsandbytes, and
# transformers / peft at the versions benchmarks/README.md names: the image lacks bitsandbytes and
# has an older transformers), prints the GPU and the versions Python imports, runs two arms at
# tiny shapes on the GPU (seconds; catches a broken install, and a wrong engine by its
# correctness gate, before the 8B model is built), then the 8B arms of benchmarks/gpu_qlora_8b.py
# in the time left: every arm passes its correctness gate before it is timed, the script starts no
# arm it cannot finish, stops one still running at its deadline, and writes its tables either way.
# results.json, results.md, the dated gpu_qlora_8b_<gpu>_<date>.md (for benchmarks/results/),
# log.txt and gpu.txt land in $OUT (or runs/bench-qlora-8b), the tiny pass's results.json and
# log.txt in $OUT/tiny. Extra arguments go to the 8B run (e.g.
# --arm "rows=128 rollout.engine=hf_static rollout.compile=true", repeated).
set -uo pipefail
start=$(date +%s)
budget="${BENCH_BUDGET_S:-450}"
wheels=(.whl/bitsandbytes-*.whl .whl/transformers-*.whl .whl/peft-*.whl)
for wheel in "${wheels[@]}"; do
    if [ ! -f "$wheel" ]; then
        echo "missing $wheel: download the wheels to .whl/ and carry it (benchmarks/README.md)" >&2
        exit 1
    fi
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
out="${OUT:-runs/bench-qlora-8b}"
mkdir -p "$out/tiny"
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c 'import bitsandbytes, peft, torch, transformers as t
print(f"torch {torch.__version__}, transformers {t.__version__}, peft {peft.__version__}, "
      f"bitsandbytes {bitsandbytes.__version__}, CUDA {torch.cuda.is_available()}")'
} 2>&1 | tee "$out/gpu.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "the carried wheels do not import (gpu.txt)" >&2; exit 1; }
if [ "${BENCH_TINY:-1}" = 1 ]; then  # BENCH_TINY=0 leaves its seconds to the 8B arms
    # --budget-s is a cap (the pass takes seconds; its estimates start from the 8B priors)
    python3 benchmarks/gpu_qlora_8b.py --tiny --out "$out/tiny" --budget-s 120 \
        --arm "rows=16 rollout.engine=hf" --arm "rows=16 rollout.engine=hf_static" \
        2>&1 | tee "$out/tiny/log.txt"
    rm -f "$out"/tiny/*.md  # its table is in log.txt: a call brings back at most 8 files
fi
# the arms' budget: what is left, less 30 s for Python's imports and the final tables
left=$((budget - ($(date +%s) - start) - 30))
# a hard stop 20 s after the arms' deadline, in case a CUDA call never returns to Python
timeout -s KILL $((left + 20)) python3 benchmarks/gpu_qlora_8b.py --out "$out" --budget-s "$left" \
    "$@" 2>&1 | tee "$out/log.txt"
