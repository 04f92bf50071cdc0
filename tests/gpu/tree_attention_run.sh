#!/usr/bin/env bash
# Tree verify attention alone, tree in the cache against tree in the staging buffer, under launch
# variants (python -m nwor_lab.bench.tree_attention): one command of at most ~4 minutes.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_attention_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 240
stage setup
gpu_device device_tree_attention.txt
stage "tree attention variants"
timeout $(lim 220) python3 -m nwor_lab.bench.tree_attention --nodes 16,32,64 --batches 8,32 \
  --out "$OUT/tree_attention_$TAG.json" > /dev/null 2> "$OUT/tree_attention.log"
echo "exit $?"
python3 - "$OUT/tree_attention_$TAG.json" <<'PY' || tail -20 "$OUT/tree_attention.log"
import json, sys
d = json.load(open(sys.argv[1]))
for s in d["summary"]:
    print(s)
for r in d["rows"]:
    print(r["nodes"], r["batch"], r["source"], r["variant"], r["kernel_us"], "err", r["max_err_vs_reference"],
          "regs", r.get("registers_per_thread"), "spill", r.get("spilled_bytes"))
PY
stage done
