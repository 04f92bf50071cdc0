#!/usr/bin/env bash
# The GPU side of the hybrid target's state strategies, in one command of at most ~9.5 minutes
# (deadline.sh cuts every stage; what finished is under $OUT):
#   1. install the project (editable, no deps) and, from wheels/ when present, fla-core + einops
#   2. (A) `bench state` on the 8B-class hybrid (random bf16 weights, forced acceptance), k 4, batch 32
#      first (the done-when row), then 1, 8, 64; JSON written after every batch; then the done-when
#      check at batch 32: stage no slower than snapshots, and at most 1/(k+1) of snapshots' steady
#      state bytes (printed and written to $OUT/state_check.json)
#   3. (B) the GPU tests of the state and the hybrid: fla against the references, the strategies with
#      fla, the hybrid through the engine (every strategy == target-only, captured == eager)
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/state_run.sh        (bench, check, then tests)
#          or in two commands:        OUT=/path bash tests/gpu/state_run.sh A      (bench + check)
#                                     OUT=/path bash tests/gpu/state_run.sh B      (the GPU tests)
# The bench runs first: its batch-32 rows are the done-when measurement (Triton compiles fla's kernels
# on first use, which can take minutes of the budget).
set -uo pipefail
PART=${1:-all}
source "$(dirname "$0")/common.sh"
gpu_begin 570
stage setup
gpu_device "device_state_$PART.txt"
gpu_install "pip_state_$PART.log"
if [ -d wheels ]; then
  python3 -m pip install -q --no-index --find-links wheels fla-core einops >> "$OUT/pip_state_$PART.log" 2>&1 \
    || echo "fla-core / einops from wheels/ failed (the torch reference runs instead)"
fi
python3 -c "from nwor_lab.ops.gated_delta import fla_available; print('fla-core usable:', fla_available('cuda'))" \
  | tee -a "$OUT/device_state_$PART.txt"
gpu_build "build_state_$PART.log"

if [ "$PART" = all ] || [ "$PART" = A ]; then
BATCHES=${BATCHES:-32,1,8,64}         # e.g. BATCHES=32,64 bash tests/gpu/state_run.sh A
BATCHES=${BATCHES//,/ }
stage "bench state: 8B-class hybrid, k 4, batch $BATCHES"
BENCH_S=${BENCH_S:-$([ "$PART" = all ] && echo 330 || echo 600)}     # all: leave the tests ~4 minutes
timeout $(lim $BENCH_S) python3 -m nwor_lab.cli bench state --model 8b-hybrid --device cuda --k 4 --batch $BATCHES \
  --repeats 2 --json --out "$OUT/state8b_$TAG.json" > "$OUT/state8b.stdout" 2> "$OUT/state8b.log"
echo "bench exit $?"; tail -3 "$OUT/state8b.log" | cut -c1-400

stage "done-when check (batch 32)"
python3 - "$OUT/state8b_$TAG.json" "$OUT/state_check.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as err:
    print(f"no bench JSON: {err}"); sys.exit(0)
rows = {(r["batch"], r["strategy"]): r for r in d["results"]}
check = {"device": d["device"], "k": d["k"], "complete": d["complete"]}
st, sn = rows.get((32, "stage")), rows.get((32, "snapshots"))
if st and sn:
    check.update(stage_tokens_per_s=st["tokens_per_s"], snapshots_tokens_per_s=sn["tokens_per_s"],
                 stage_step_ms=st["step_ms"], snapshots_step_ms=sn["step_ms"],
                 stage_no_slower=st["tokens_per_s"] >= sn["tokens_per_s"],
                 stage_steady=st["state_bytes_steady_allocated"], snapshots_steady=sn["state_bytes_steady_allocated"],
                 stage_memory_at_most_1_over_k1=st["state_bytes_steady_allocated"] * (d["k"] + 1)
                 <= sn["state_bytes_steady_allocated"])
for r in d["results"]:
    print(r["batch"], r["strategy"], "correct" if r["correct"] else f"WRONG at {r['first_divergence']}",
          f"{r['tokens_per_s']} tok/s", f"{r['step_ms']} ms/step", f"L={r['mean_acceptance_length']}",
          f"steady {r['state_bytes_steady'] / 2**20:.0f} MiB", f"window {r['state_bytes_window'] / 2**20:.0f} MiB",
          f"gap {r.get('max_logit_gap')} (not argmax {r.get('target_tokens_not_argmax')} of "
          f"{r.get('target_tokens_checked')})", f"replays {r['replayed_steps']}")
print(json.dumps(check))
json.dump(check, open(sys.argv[2], "w"), indent=1)
EOF
fi

if [ "$PART" = all ] || [ "$PART" = B ]; then
  stage "GPU tests: gated delta (fla), the hybrid through the engine"
  timeout $(lim $([ "$PART" = B ] && echo 540 || echo 240)) python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_gpu_gated_delta.py \
    tests/gpu/test_gpu_state_engine.py > "$OUT/pytest_state.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$OUT/pytest_state.log" | tail -15
fi

stage done
