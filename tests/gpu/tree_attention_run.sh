#!/usr/bin/env bash
# Stage's tree verify attention under launch knobs, in the whole tree step:
#   step KNOBS     the whole tree step, write-all + move against stage, eager and graphed, profiled
#                  (`bench tree --model 8b`), with stage's tree-window launch set by KNOBS
#                  (NWOR_LAB_TREE_WINDOW_LAUNCH, e.g. num_warps=8) -> $OUT/tree_8b_<knobs>_<card>.json
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
  # registers and spills of every compiled verify-attention kernel (which variant is which: its .json)
  for c in $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name "_verify_attention_kernel.cubin" 2>/dev/null); do
    j="${c%.cubin}.json"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); c=d.get('constants', {}); print({k: c.get(k) for k in ('HAS_WINDOW','TREE','ROW_LOOP','BLOCK_M','SPLIT_TAIL','SPLIT')}, 'warps', d.get('num_warps'))" "$j" 2>/dev/null
    cuobjdump --dump-resource-usage "$c" 2>/dev/null | grep -E "REG|spill" | head -2
  done > "$OUT/kernel_resources_${NAME_K}.txt"
  cat "$OUT/kernel_resources_${NAME_K}.txt" | head -40
fi
stage done
