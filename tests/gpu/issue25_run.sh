#!/usr/bin/env bash
# The GPU side of the one-step redesign, in commands of at most ~9.5 minutes each (deadline.sh cuts
# every stage; what finished is under $OUT):
#   A   the engine's GPU tests (eager == graphed, mixed steps, rings from graphs, the captured body ==
#       the body run eagerly); `bench engine --model 8b` (EAGLE-1/EAGLE-3 k 4, off/stage, batch 1/8/32)
#       of this tree and of the baseline tree in gpu_baseline/ (if present) on the same card;
#       `bench step` on the 8B shape (batch 1/16/64, k 4, acceptance 0.5)
#   B   the rest of the GPU suite
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/issue25_run.sh A    (then B)
set -uo pipefail
PART=${1:-A}
source "$(dirname "$0")/common.sh"
gpu_begin 570
stage setup
gpu_device "device_$PART.txt"
gpu_install "pip_$PART.log"
gpu_build "build_$PART.log"
ENGINE_ARGS="--model 8b --device cuda --batch-sizes 1,8,32 --ks 4 --heads eagle1,eagle3 --policies off,stage --no-hf --repeats 2"
if [ "$PART" = A ]; then
  stage "the engine's GPU tests"
  timeout $(lim 200) python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_gpu_engine.py \
    tests/gpu/test_gpu_engine_mixed.py tests/gpu/test_gpu_step_graph.py tests/gpu/test_gpu_ring.py > "$OUT/pytest_A.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_A.log" | tail -15
  if [ -d gpu_baseline/nwor_lab ]; then
    stage "bench engine 8b: baseline tree"
    (cd gpu_baseline && PYTHONPATH=$PWD timeout $(lim 150) python3 -m nwor_lab.bench.engine8b $ENGINE_ARGS \
      --out "$OUT/engine8b_base_$TAG.json" > "$OUT/engine8b_base.log" 2>&1); echo "base exit $?"
  fi
  stage "bench engine 8b: this tree"
  timeout $(lim 150) python3 -m nwor_lab.bench.engine8b $ENGINE_ARGS --out "$OUT/engine8b_new_$TAG.json" \
    > "$OUT/engine8b_new.log" 2>&1; echo "new exit $?"
  stage "bench step 8b"
  timeout $(lim 150) python3 -m nwor_lab.bench.step --models 8b --batches 1,16,64 --ks 4 --rates 0.5 --json \
    --out "$OUT/step8b_$TAG.json" > /dev/null 2> "$OUT/step.log"; echo "step exit $?"; tail -3 "$OUT/step.log" | cut -c1-600
fi
if [ "$PART" = B ]; then
  stage "the rest of the GPU suite"
  timeout $(lim 540) python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu tests \
    --ignore=tests/gpu/test_gpu_engine.py --ignore=tests/gpu/test_gpu_engine_mixed.py \
    --ignore=tests/gpu/test_gpu_step_graph.py --ignore=tests/gpu/test_gpu_ring.py --ignore=tests/gpu/test_gpu_tp.py \
    --ignore=tests/test_chapter_exercises.py > "$OUT/pytest_B.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_B.log" | tail -15
fi
stage done
