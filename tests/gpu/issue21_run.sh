#!/usr/bin/env bash
# The GPU side of issue 21, in two commands of at most ~9.5 minutes each (a deadline cuts every
# stage so that the command ends before 570 s whatever happens; what finished is under $OUT):
#   A   GPU tests of the new paths (mixed steps from graphs, forced acceptance, the attention tail);
#       `bench engine --model 8b` (batch 1/8/32 x target-only, EAGLE-1/EAGLE-3 shapes x k 2/4/6 x
#       off/cow/stage, HF generate); the engine's earlier GPU tests in the time left
#   B   `bench step` on the 8B shape (batch 1/16/64, k 4, acceptance 0.5, policies interleaved),
#       ncu of verify attention's window vs cache variant before/after, compute-sanitizer memcheck +
#       racecheck over the Triton kernels
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/issue21_run.sh A    (then B)
set -uo pipefail
PART=${1:-A}
START=$(date +%s)
export DEADLINE=$((START + ${BUDGET:-570}))
OUT=${OUT:-/tmp/nwor_out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 NWOR_LAB_CACHE_DIR=${NWOR_LAB_CACHE_DIR:-/tmp/nwor_ext}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
source "$(dirname "$0")/deadline.sh"
stage() { echo "=== $1 (t = $(( $(date +%s) - START )) s)"; }

stage setup
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null || true; } | tee "$OUT/device_$PART.txt"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
TAG=$(echo "$NAME" | grep -oiE 'h100|h200|a100|l40s|b200' | head -1 | tr 'A-Z' 'a-z'); TAG=${TAG:-gpu}
python3 -m pip install -q -e . --no-deps --no-build-isolation > "$OUT/pip_$PART.log" 2>&1 || echo "pip -e failed: PYTHONPATH used"
timeout $(lim 150) python3 -c "from nwor_lab.ops import _ext; _ext.load(); print(_ext.build_info())" \
  > "$OUT/build_$PART.log" 2>&1; echo "extension build exit $?"

if [ "$PART" = A ]; then
  stage "GPU tests of the new paths"
  timeout $(lim 200) python3 -m pytest -q -rf --tb=short -p no:cacheprovider \
    tests/gpu/test_gpu_engine_mixed.py tests/gpu/test_gpu_verify_attention_tail.py > "$OUT/pytest_issue21.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_issue21.log" | tail -15
  stage "bench engine --model 8b"
  timeout $(lim 400) python3 -m nwor_lab.cli.main bench engine --model 8b --device cuda \
    --out "$OUT/engine8b_$TAG.json" > "$OUT/engine8b.log" 2>&1
  echo "bench exit $?"; tail -4 "$OUT/engine8b.log" | cut -c1-400
  stage "the engine's earlier GPU tests (regression), in the time left"
  timeout $(lim 200) python3 -m pytest -q -rf --tb=short -p no:cacheprovider \
    tests/gpu/test_gpu_engine.py tests/gpu/test_gpu_step_graph.py > "$OUT/pytest_engine.log" 2>&1
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_engine.log" | tail -15
fi

if [ "$PART" = B ]; then
  stage "bench step (8B, k 4, a 0.5)"
  timeout $(lim 150) python3 -m nwor_lab.bench.step --models 8b --batches 1,16,64 --ks 4 --rates 0.5 --json \
    --out "$OUT/step_issue21_$TAG.json" > /dev/null 2> "$OUT/step.log"
  echo "step exit $?"; grep -E '"batch"' "$OUT/step.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(f\"batch {r['batch']:2d}: graphed stage/off {r['stage']['graph_vs_off']:.4f} cow/off {r['cow']['graph_vs_off']:.4f}\"
          f\"  eager stage/off {r['stage']['eager_vs_off']:.4f} cow/off {r['cow']['eager_vs_off']:.4f}\")"
  stage "ncu: verify attention window vs cache, before / after"
  bash tests/gpu/ncu_verify_attention.sh
  # (the staggered-arrivals run that was here is gone with `--arrivals staggered`: requests
  #  joining mid-run in wall-clock time are tests/gpu/serve_run.sh's `bench serve`)
  stage "compute-sanitizer over the Triton kernels"
  bash tests/gpu/sanitize.sh
fi
stage done
