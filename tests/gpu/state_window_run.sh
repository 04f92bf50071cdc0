#!/usr/bin/env bash
# The state strategies over one verify window on the GPU, layer level (`python -m nwor_lab.bench.state_window`):
# Qwen3-Next-80B-A3B's linear layers (36 gated DeltaNet layers, 32 value heads of 128 x 128, conv 8192 wide,
# bf16), k = 4, batch 1, 8 and 32; fla's kernels when fla-core imports (set FLA_WHEEL to a carried wheel to
# install it), else the torch reference (`backend` in the JSON says which). A few minutes at most.
# Writes $OUT/state_window_qwen3-next_<card>.json (chapter 13 reads benchmarks/results/state_window*.json:
# copy it there) and state_window.log.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/state_window_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 420
stage setup
gpu_device device_state_window.txt
gpu_install pip_state_window.log
if [ -n "${FLA_WHEEL:-}" ]; then python3 -m pip install -q --no-deps "$FLA_WHEEL" >> "$OUT/pip_state_window.log" 2>&1 || echo "fla-core install failed"; fi
python3 -c "import fla.ops.gated_delta_rule; print('fla-core imports: backend fla')" 2>/dev/null || echo "no fla-core: backend torch"

stage "bench state_window --shape qwen3-next"
timeout $(lim 400) python3 -m nwor_lab.bench.state_window --json --shape qwen3-next --batch 1 8 32 --k 4 --reps 5 \
  --device cuda > "$OUT/state_window_qwen3-next_$TAG.json" 2> "$OUT/state_window.log"
echo "bench state_window exit $?"
python3 - "$OUT/state_window_qwen3-next_$TAG.json" <<'PY' || tail -5 "$OUT/state_window.log" | cut -c1-400
import json, sys
d = json.load(open(sys.argv[1]))
print(d["device"], d["backend"], d["torch"])
for r in d["rows"]:
    print(f"batch {r['batch']:>3d} {r['strategy']:9s} window {r['window_ms']:8.3f} ms commit {r['commit_ms']:8.3f} ms "
          f"steady {r['state_bytes_steady'] / 2**20:7.1f} MiB window {r['state_bytes_window'] / 2**20:7.1f} MiB")
PY
stage done
