#!/usr/bin/env bash
# Tree windows on the GPU, in one command of at most ~9.5 minutes (deadline.sh cuts every stage; what
# finished is under $OUT; the bench comes first: it is what the time is for):
#   1  `nwor-lab bench tree --model 8b`: write-all + move, write-all + remap (block size 1), cow, stage
#      at N = 16/32/64, block size 16, batch 1/8/32, context 1024, 3 forced accepted nodes: SpecEngine decode
#      steps (3 runs of 6 steps a strategy, round-robin; remap: its window microbenchmark beside move's),
#      also on engines replaying CUDA graphs (`--graphs`, stage/move as the median of per-run ratios) and
#      profiled (`--profile`: the decode steps' top kernels) -> $OUT/tree_8b_<card>.json; its summary says whether stage is no slower
#      than write-all + move everywhere, eager and graphed (each row is also printed to bench_tree_8b.log as it is made)
#   2  the tree GPU tests (tests/gpu/test_gpu_tree*.py: tree attention vs the reference, the commit ops,
#      a graphed tree step, bench tree's 8B path at toy size; the engine's tree tests where present)
#   3  `bench tree` on the shipped pair on this GPU (real EAGLE-2 trees, greedy) -> tree_shipped_<card>.json
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 570
stage setup
gpu_device device_tree.txt
gpu_install pip_tree.log
gpu_build build_tree.log

stage "bench tree 8b (eager)"
timeout $(lim 330) python3 -m nwor_lab.cli bench tree --model 8b --nodes 16,32,64 --batches 1,8,32 \
  --block-size 16 --context 1024 --accepted 3 --graphs --profile --reps 3 --out "$OUT/tree_8b_$TAG.json" \
  > /dev/null 2> "$OUT/bench_tree_8b.log"
echo "bench tree 8b exit $?"; tail -2 "$OUT/bench_tree_8b.log" | cut -c1-400
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['summary']))" \
  "$OUT/tree_8b_$TAG.json" 2>/dev/null || echo "no 8b summary"

stage "tree GPU tests"
timeout $(lim 170) python3 -m pytest -q -rf --tb=short -p no:cacheprovider -m gpu tests/gpu/test_gpu_tree*.py \
  > "$OUT/pytest_tree.log" 2>&1
echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_tree.log" | tail -15

stage "bench tree shipped (this GPU)"
timeout $(lim 60) python3 -m nwor_lab.cli bench tree --model shipped --device cuda \
  --out "$OUT/tree_shipped_$TAG.json" > /dev/null 2> "$OUT/bench_tree_shipped.log"
echo "bench tree shipped exit $?"; tail -2 "$OUT/bench_tree_shipped.log" | cut -c1-400
stage done
