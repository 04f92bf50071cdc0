#!/usr/bin/env bash
# Draft trees through the engine on the GPU, in commands of at most ~9.5 minutes each (deadline.sh
# cuts every stage; what finished is under $OUT, JSON written as rows finish):
#   A   tests/gpu/test_gpu_tree_engine.py (greedy tree == target-only, off/cow/stage, EAGLE-1/3;
#       graphs asked for == eager; Triton == torch attention; bf16; T > 0); then the 8B shape, tree vs
#       chain at N = 16/32/64, stage vs off (their runs in turn, 5 each), batch 1 and 8 (forced acceptance from profiles measured
#       first on the shipped pair with the same tree / chain, in the same run)
#   B   the same 8B comparison at batch 32
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_engine_run.sh A    (then B)
set -uo pipefail
PART=${1:-A}
source "$(dirname "$0")/common.sh"
gpu_begin 570
stage setup
gpu_device "tree_device_$PART.txt"
gpu_install "tree_pip_$PART.log"
gpu_build "tree_build_$PART.log"
BENCH="python3 -m nwor_lab.bench.tree_engine 8b --model 8b --device cuda --nodes 16,32,64 --policies off,stage --new-tokens 32 --repeats 5"
if [ "$PART" = A ]; then
  stage "tree engine GPU tests"
  timeout $(lim 200) python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_gpu_tree_engine.py \
    > "$OUT/tree_pytest_A.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tree_pytest_A.log" | tail -15
  stage "tree vs chain, 8B, batch 1 and 8"
  timeout $(lim 540) $BENCH --batch-sizes 1,8 --out "$OUT/tree_engine8b_b1_b8_$TAG.json" \
    > "$OUT/tree_engine8b_A.log" 2>&1; echo "bench exit $?"; tail -2 "$OUT/tree_engine8b_A.log" | cut -c1-400
fi
if [ "$PART" = B ]; then
  stage "tree vs chain, 8B, batch 32"
  timeout $(lim 560) $BENCH --batch-sizes 32 --out "$OUT/tree_engine8b_b32_$TAG.json" \
    > "$OUT/tree_engine8b_B.log" 2>&1; echo "bench exit $?"; tail -2 "$OUT/tree_engine8b_B.log" | cut -c1-400
fi
stage done
