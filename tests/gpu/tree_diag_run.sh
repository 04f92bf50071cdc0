#!/usr/bin/env bash
# Why stage's tree step can be slower than write-all + move, and why a forced-acceptance tree fails to
# capture on the 8B shape: one command of at most ~8 minutes (a deadline cuts every stage):
#   1  `bench tree --model 8b`, write-all + move and stage only, N = 16/32/64, batch 1/8/32, eager
#      (CUDA events) AND replayed from one CUDA graph per step (`--graphs`: no host time in the
#      comparison), with each step's top kernels (`--profile`) -> $OUT/tree_8b_graphs_<card>.json
#   2  the tree engine on the 8B shape with forced tree acceptance, N = 16, batch 1, stage, captured:
#      a failing config's row carries its stack (`where`) -> $OUT/tree_engine8b_diag_<card>.json
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/tree_diag_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 480
stage setup
gpu_device device_tree_diag.txt
gpu_install pip_tree_diag.log
gpu_build build_tree_diag.log

stage "bench tree 8b: move vs stage, eager and graphed, profiled"
timeout $(lim 300) python3 -m nwor_lab.cli bench tree --model 8b --nodes 16,32,64 --batches 1,8,32 \
  --block-size 16 --context 1024 --accepted 3 --strategies move,stage --graphs --profile --reps 10 \
  --out "$OUT/tree_8b_graphs_$TAG.json" > /dev/null 2> "$OUT/bench_tree_diag.log"
echo "bench tree exit $?"; tail -2 "$OUT/bench_tree_diag.log" | cut -c1-300
python3 - "$OUT/tree_8b_graphs_$TAG.json" <<'PY' || echo "no bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps(d["summary"]))
for r in d["rows"]:
    print(r["strategy"], r["nodes"], r["batch"], "eager", r.get("step_ms"), "graph", r.get("graph_step_ms"),
          r.get("graph_error", "")[:120])
    for k in r.get("kernels", [])[:6]:
        print("     ", k["us_per_step"], "us", k["calls_per_step"], "x", k["kernel"][:80])
PY

stage "tree engine 8b, forced tree acceptance, captured (the stack of a failure)"
timeout $(lim 150) python3 -m nwor_lab.bench.tree_engine 8b --model 8b --device cuda --nodes 16 --policies stage \
  --batch-sizes 1 --new-tokens 16 --repeats 1 --out "$OUT/tree_engine8b_diag_$TAG.json" \
  > "$OUT/tree_engine8b_diag.log" 2>&1
echo "tree engine exit $?"
python3 - "$OUT/tree_engine8b_diag_$TAG.json" <<'PY' || tail -30 "$OUT/tree_engine8b_diag.log"
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print({k: v for k, v in r.items() if k != "where"})
    if "where" in r:
        print(r["where"][-2500:])
PY
stage done
