#!/usr/bin/env bash
# One GPU-machine session for the CUDA extension: install, build, GPU tests, kernel benchmark,
# compute-sanitizer memcheck (every kernel, exact allocations) and racecheck (the shared-memory
# SCV kernel). Logs and kernels.json go to $OUT; a summary is printed last.
#   usage (repo root, GPU machine):  bash tests/gpu/device_run.sh [stages...]
#   stages: build tests bench memcheck racecheck   (default: all)
set -uo pipefail
OUT=${OUT:-/tmp/nwor_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NWOR_LAB_CACHE_DIR=${NWOR_LAB_CACHE_DIR:-/tmp/nwor_ext}
STAGES=${*:-build tests bench memcheck racecheck}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
has() { [[ " $STAGES " == *" $1 "* ]]; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$OUT/device.txt"
# The install may fail offline (setuptools' develop shells out to an isolated pip); the repo root
# on PYTHONPATH is all the tests and benchmark need.
python3 -m pip install -q -e . --no-deps --no-build-isolation > "$OUT/pip.log" 2>&1 || echo "pip install -e failed (see pip.log); using PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if has build; then
  python3 -c "from nwor_lab.ops import _ext; _ext.load(); print(_ext.build_info())" > "$OUT/build.log" 2>&1
  tail -3 "$OUT/build.log"
fi
if has tests; then
  # 420 s: test_verify_attention_gpu.py compiles ~35 Triton kernel variants (~5-7 s each, cold)
  timeout 420 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu > "$OUT/pytest_gpu.log" 2>&1
  echo "pytest exit $?"
fi
if has bench; then
  timeout 150 python3 -m nwor_lab.bench.kernels --json --out "$OUT/kernels.json" > /dev/null 2> "$OUT/bench.log"
  echo "bench exit $?"
fi
if has memcheck; then
  NWOR_LAB_SANITIZE=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 "$SAN" --tool memcheck \
    --print-limit 20 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not graph and not opcheck" \
    > "$OUT/memcheck.log" 2>&1
  echo "memcheck exit $?"
fi
if has racecheck; then
  NWOR_LAB_SANITIZE=1 timeout 90 "$SAN" --tool racecheck --kernel-name kns=scv_mask --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider tests/gpu -k "scv_mask" > "$OUT/racecheck.log" 2>&1
  echo "racecheck exit $?"
fi

echo "==================== summary"
cat "$OUT/device.txt"
[ -f "$OUT/build.log" ] && grep -E "build_seconds|Error|error" "$OUT/build.log" | head -20
if [ -f "$OUT/pytest_gpu.log" ]; then
  echo "--- pytest tests/gpu"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/pytest_gpu.log" | tail -25
fi
for t in memcheck racecheck; do
  if [ -f "$OUT/$t.log" ]; then
    echo "--- $t"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|Unknown|unrecognized|Error:" "$OUT/$t.log" | tail -6
  fi
done
[ -f "$OUT/bench.log" ] && { echo "--- bench"; tail -40 "$OUT/bench.log"; }
exit 0
