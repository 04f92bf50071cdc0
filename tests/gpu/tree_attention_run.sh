#!/usr/bin/env bash
# The tree-window kernel (`_tree_window_kernel`) under launch knobs, in the whole tree step:
#   step KNOBS     the whole tree step, write-all + move against stage, eager and graphed, profiled
#                  (`bench tree --model 8b`), with the tree-window kernel's launch set by KNOBS
#                  (NWOR_LAB_TREE_WINDOW_LAUNCH, e.g. num_warps=8,block_m=64) -> $OUT/tree_8b_<knobs>_<card>.json
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_attention_run.sh [step num_warps=8]
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 300
stage setup
gpu_device device_tree_attention.txt
if [ "${1:-}" = step ]; then        # (the only mode)
  KNOBS=${2:-}; NAME_K=$(echo "${KNOBS:-default}" | tr ',=' '__')
  stage "bench tree 8b move vs stage, stage's tree window launched with '${KNOBS}'"
  NWOR_LAB_TREE_WINDOW_LAUNCH="$KNOBS" timeout $(lim 280) python3 -m nwor_lab.cli bench tree --model 8b \
    --nodes 16,32,64 --batches 1,8,32 --block-size 16 --context 1024 --accepted 3 --strategies move,stage \
    --graphs --profile --reps 10 --out "$OUT/tree_8b_${NAME_K}_$TAG.json" > /dev/null 2> "$OUT/tree_8b_${NAME_K}.log"
  echo "exit $?"
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" \
    "$OUT/tree_8b_${NAME_K}_$TAG.json" || tail -5 "$OUT/tree_8b_${NAME_K}.log"
  # registers and spills of every compiled attention kernel in this machine's Triton cache (a fresh
  # machine: the kernels this bench compiled; run it first, or other runs' kernels are listed too)
  for c in $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name "_verify_attention_kernel.cubin" -o \
             -name "_tree_window_kernel.cubin" 2>/dev/null); do
    echo "$(basename "$c") $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('warps', d.get('num_warps'), 'stages', d.get('num_stages'))" "${c%.cubin}.json" 2>/dev/null)"
    cuobjdump --dump-resource-usage "$c" 2>/dev/null | grep -E "REG" | head -1
  done > "$OUT/kernel_resources_${NAME_K}.txt"
  cat "$OUT/kernel_resources_${NAME_K}.txt" | head -40
fi
stage done
