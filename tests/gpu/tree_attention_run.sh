#!/usr/bin/env bash
# Tree verify attention, tree in the cache against tree in the staging buffer (stage):
#   (no argument)  the kernel alone under each launch variant, one process per variant beside the
#                  default (a variant that faults cannot take the others with it)
#                  -> $OUT/tree_attention_<variant>_<card>.json
#   step KNOBS     the whole tree step, write-all + move against stage, eager and graphed, profiled
#                  (`bench tree --model 8b`), with stage's tree-window launch set by KNOBS
#                  (NWOR_LAB_TREE_WINDOW_LAUNCH, e.g. num_warps=8) -> $OUT/tree_8b_<knobs>_<card>.json
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_attention_run.sh [step num_warps=8]
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 300
stage setup
gpu_device device_tree_attention.txt
if [ "${1:-}" = step ]; then
  KNOBS=${2:-}; NAME_K=$(echo "${KNOBS:-default}" | tr ',=' '__')
  stage "bench tree 8b move vs stage, stage's tree window launched with '${KNOBS}'"
  NWOR_LAB_TREE_WINDOW_LAUNCH="$KNOBS" timeout $(lim 280) python3 -m nwor_lab.cli bench tree --model 8b \
    --nodes 16,32,64 --batches 1,8,32 --block-size 16 --context 1024 --accepted 3 --strategies move,stage \
    --graphs --profile --reps 10 --out "$OUT/tree_8b_${NAME_K}_$TAG.json" > /dev/null 2> "$OUT/tree_8b_${NAME_K}.log"
  echo "exit $?"
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['summary']))" \
    "$OUT/tree_8b_${NAME_K}_$TAG.json" || tail -5 "$OUT/tree_8b_${NAME_K}.log"
else
  for v in split_tail warps8 stages2 block_m128 split_tail_warps8 block_m32; do
    stage "variant $v"
    timeout $(lim 60) python3 -m nwor_lab.bench.tree_attention --nodes 16,64 --batches 8,32 --variants default,$v \
      --out "$OUT/tree_attention_${v}_$TAG.json" > /dev/null 2> "$OUT/tree_attention_$v.log"
    echo "exit $?"
    python3 - "$OUT/tree_attention_${v}_$TAG.json" <<'PY' || tail -3 "$OUT/tree_attention_$v.log" | cut -c1-300
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["summary"]:
    print(s)
for r in d["rows"]:
    print(r["nodes"], r["batch"], r["source"], r["variant"], r["kernel_us"], "err", r["max_err_vs_reference"],
          "regs", r.get("registers_per_thread"), "spill", r.get("spilled_bytes"))
PY
  done
fi
stage done
