#!/usr/bin/env bash
# `nwor-lab bench serve` on the Llama-3-8B shape (random weights, EAGLE-3-shaped head, the shipped
# forced-acceptance profile), one command of at most ~8 minutes (a deadline cuts every stage; what
# finished is under $OUT, the JSON is rewritten after every config):
#   configs      target-only, EAGLE-3 k 4, EAGLE-3 k auto (AdaptiveK, k_max 4), write policy stage
#   open loop    Poisson arrivals at 2, 4, 8, 16, 32 and 64 requests/s
#   closed loop  1, 8 and 32 clients
#   workload     32 requests per open-loop point, 4 per client in closed loop (at least 32), prompts
#                64 +- 25 % random ids, outputs 64 +- 25 %
#   components   decode step, verify step (1 + 4 tokens) and one head pass at batch 1 / 8 / 32
# Then the closed loop again with 256-token outputs (prompts 64): the same engine with less of each
# request spent in prefill (serving outputs are longer than 64 tokens) -> serve_8b_long_<card>.json.
# Writes $OUT/serve_8b_<card>.json (chapter 11 reads benchmarks/results/serve_8b_<card>.json: copy
# it there) and serve_8b.log.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/serve_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 480
stage setup
gpu_device device_serve.txt
gpu_install pip_serve.log

stage "bench serve --model 8b"
timeout $(lim 250) python3 -m nwor_lab.bench.serve --model 8b --device cuda \
  --configs target,eagle3:4,eagle3:auto --k-max 4 --policies stage \
  --rates 2,4,8,16,32,64 --concurrency 1,8,32 --requests 32 --prompt-len 64 --output-len 64 \
  --goodput tpot:50 --components 1,8,32 --quiet \
  --out "$OUT/serve_8b_$TAG.json" > "$OUT/serve_8b.log" 2>&1
echo "bench serve exit $?"
report() { python3 - "$1" <<'PY' || tail -5 "$2" | cut -c1-400
import json, sys
d = json.load(open(sys.argv[1]))
print(d["device"], "complete" if d["complete"] else "INCOMPLETE", d["seconds_total"], "s")
for r in d["results"]:
    load = f"rate {r['rate']}" if r["mode"] == "open" else f"{r['concurrency']} clients"
    print(f"{r['config']:28s} {load:12s} out {r['output_throughput']:8.1f} tok/s  TPOT p50/p99 "
          f"{r['p50_tpot_ms']}/{r['p99_tpot_ms']} ms  TTFT p50 {r['p50_ttft_ms']} ms  batch "
          f"{r['occupancy']['mean_batch']}  L {r.get('accept_length')}")
for c in d["crossover"]:
    print("crossover", c)
PY
}
report "$OUT/serve_8b_$TAG.json" "$OUT/serve_8b.log"
stage "bench serve --model 8b, closed loop, 256-token outputs"
timeout $(lim 200) python3 -m nwor_lab.bench.serve --model 8b --device cuda \
  --configs target,eagle3:4,eagle3:auto --k-max 4 --policies stage \
  --concurrency 1,8,32 --prompt-len 64 --output-len 256 \
  --goodput tpot:50 --components 1,8,32 --quiet \
  --out "$OUT/serve_8b_long_$TAG.json" > "$OUT/serve_8b_long.log" 2>&1
echo "bench serve (long) exit $?"
report "$OUT/serve_8b_long_$TAG.json" "$OUT/serve_8b_long.log"
stage done
