#!/usr/bin/env bash
# Tensor parallelism on the two-GPU machine (NCCL, NVLink SHARP multicast off): the tp GPU tests,
# then `nwor-lab bench tp` tp 1 vs 2 on the Llama-3-8B-shaped model (random weights, bf16).
#   usage (repo root, >= 2 GPUs):  bash tests/gpu/device_run_tp.sh [tests] [bench]
# Logs and step_tp.json go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/nwor_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NWOR_LAB_CACHE_DIR=${NWOR_LAB_CACHE_DIR:-/tmp/nwor_ext}
export NCCL_NVLS_ENABLE=0                # keep NVLink multicast off
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
STAGES=${*:-tests bench}
has() { [[ " $STAGES " == *" $1 "* ]]; }

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/device_tp.txt"
if has tests; then
  timeout 500 python3 -m pytest -q -rf -s --tb=short -p no:cacheprovider tests/gpu/test_gpu_tp.py > "$OUT/pytest_gpu_tp.log" 2>&1
  echo "pytest tp exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|skipped|tp=2 over NCCL" "$OUT/pytest_gpu_tp.log" | tail -15
fi
if has bench; then
  timeout 550 python3 -m nwor_lab.cli bench tp --tp 1,2 --device cuda --batch-sizes 1,8 --k 0,4 \
    --nwor off,stage --out "$OUT/step_tp.json" > "$OUT/bench_tp.log" 2>&1
  echo "bench tp exit $?"; tail -20 "$OUT/bench_tp.log"
fi
