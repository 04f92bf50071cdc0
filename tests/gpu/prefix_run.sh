#!/usr/bin/env bash
# `nwor-lab bench prefix` on the Llama-3-8B shape (random bf16 weights, EAGLE-1- and EAGLE-3-shaped
# heads, the shipped forced-acceptance profile at k = 3), one command of at most ~9 minutes (a deadline
# cuts every stage; the JSON is written after the untimed pass and again at the end, `complete` says which):
#   workload   8 conversations x 2 turns, a 256-token shared system prompt, 32 new tokens a turn,
#              closed loop, block size 16 (stated in the JSON)
#   configs    target-only with and without prefix caching; EAGLE-3: no prefix caching, and every
#              head-cache x lookahead under stage
#   then       EAGLE-3 alone with a small cache (--num-blocks 48) under swap and recompute preemption
# Steps run eagerly (every run builds a fresh engine: module docstring of nwor_lab/bench/prefix.py).
# Writes $OUT/prefix_8b_<card>.json, prefix_8b_small_{swap,recompute}_<card>.json and their logs;
# copy them to benchmarks/results/.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/prefix_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 540
stage setup
gpu_device device_prefix.txt
gpu_install pip_prefix.log

report() { python3 - "$1" <<'PY' || tail -5 "$2" | cut -c1-400
import json, sys
d = json.load(open(sys.argv[1]))
print(d["device"], "complete" if d["complete"] else "INCOMPLETE", d["seconds_total"], "s", d["workload"])
for r in d["results"]:
    if "refused" in r:
        print(f"{r['config']:36s} refused"); continue
    print(f"{r['config']:36s} hit {r['hit_rate']:.3f} recomputed {r['recomputed_tokens']:6d} "
          f"L {r['acceptance_length']} after hit {r['acceptance_length_after_hit']} "
          f"(no prefix {r['acceptance_length_same_requests_no_prefix']}) {r.get('tokens_per_s')} tok/s "
          f"TTFT p50 {r.get('ttft_ms', {}).get('p50')} ms TPOT p50 {r.get('tpot_ms', {}).get('p50')} ms "
          f"preempt {r['preemptions']} swapped {r['swapped_out_bytes']}")
PY
}

stage "bench prefix --model 8b"
# the bench's 8B default workload (32 x 3 turns, 512-token system prompt) did not finish its untimed pass in
# 320 s on an H200 (eager steps); this one ran in 98 s (benchmarks/results/prefix_8b_h200.json)
SMALL_WORKLOAD="--conversations 8 --turns 2 --system-tokens 256 --max-new-tokens 32"
timeout $(lim 330) python3 -m nwor_lab.bench.prefix --model 8b --device cuda --heads eagle3 --policies stage \
  $SMALL_WORKLOAD --repeats 2 --quiet --out "$OUT/prefix_8b_$TAG.json" > "$OUT/prefix_8b.log" 2>&1
echo "bench prefix exit $?"
report "$OUT/prefix_8b_$TAG.json" "$OUT/prefix_8b.log"
for mode in swap recompute; do
  stage "bench prefix --model 8b, small cache, $mode"
  timeout $(lim 80) python3 -m nwor_lab.bench.prefix --model 8b --device cuda --heads eagle3 --policies stage \
    --head-caches cached --lookaheads boundary $SMALL_WORKLOAD --num-blocks 48 --preemption $mode --repeats 1 --quiet \
    --out "$OUT/prefix_8b_small_${mode}_$TAG.json" > "$OUT/prefix_8b_small_$mode.log" 2>&1
  echo "bench prefix ($mode) exit $?"
  report "$OUT/prefix_8b_small_${mode}_$TAG.json" "$OUT/prefix_8b_small_$mode.log"
done
stage done
