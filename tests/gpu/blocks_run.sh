#!/usr/bin/env bash
# The GPU side of blocks that outlive a request (prefix caching, preemption, abort) and of the
# defaults that replay graphs, in one command of at most ~9 minutes (deadline.sh cuts every stage):
#   1. install the project (editable, no deps), build the CUDA extension
#   2. the GPU tests: the defaults replay graphs, graphed == eager, prefix hits from captured buckets,
#      preemption from captured and pre-launched steps, the hybrid target's state through the engine
#   3. (when nwor_lab/bench/prefix.py exists) `bench prefix --model 8b` on the 8B shape, JSON under $OUT
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/blocks_run.sh [tests|bench|all]
set -uo pipefail
PART=${1:-all}
source "$(dirname "$0")/common.sh"
gpu_begin 540
stage setup
gpu_device "device_blocks_$PART.txt"
gpu_install "pip_blocks_$PART.log"
gpu_build "build_blocks_$PART.log"
if [ "$PART" != bench ]; then
  stage tests
  timeout $(lim 120) python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_engine.py \
    -k "default_config or graphed_steps" 2>&1 | tail -15 | tee "$OUT/tests_blocks.txt"
  timeout $(lim 240) python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gpu_prefix.py \
    tests/gpu/test_gpu_preemption.py 2>&1 | tail -40 | tee -a "$OUT/tests_blocks.txt"
  for t in tests/gpu/test_gpu_prefix_*.py tests/gpu/test_gpu_handoff*.py; do
    [ -f "$t" ] || continue
    timeout $(lim 120) python3 -m pytest -q -p no:cacheprovider -m gpu "$t" 2>&1 | tail -15 | tee -a "$OUT/tests_blocks.txt"
  done
fi
if [ "$PART" != tests ] && [ -f nwor_lab/bench/prefix.py ]; then
  stage "bench prefix 8b"
  timeout $(lim 240) python3 -m nwor_lab.bench.prefix --model 8b --device cuda --out "$OUT/prefix_8b_$TAG.json" \
    2>&1 | tail -30 | tee "$OUT/bench_prefix.txt"
fi
stage done
