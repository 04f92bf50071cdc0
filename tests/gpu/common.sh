# Sourced by the GPU scripts (after `set -uo pipefail`): the preamble they share.
#   gpu_begin BUDGET           START, DEADLINE (START + $BUDGET or this default), OUT (made), the
#                              exports every run needs, `lim` (deadline.sh) and `stage NAME`
#   gpu_device FILE [NOTE]     the card, driver, torch/cuda/triton (and git HEAD) into $OUT/FILE;
#                              sets NAME and TAG (h100, h200, ... or gpu: the JSON files' suffix)
#   gpu_install LOG            the project, editable and without dependencies (PYTHONPATH=$PWD either way)
#   gpu_build LOG              the CUDA extension, built once (at most 150 s of the budget)
source "$(dirname "${BASH_SOURCE[0]}")/deadline.sh"

gpu_begin() {
  START=$(date +%s)
  export DEADLINE=$((START + ${BUDGET:-$1}))
  OUT=${OUT:-/tmp/nwor_out}
  mkdir -p "$OUT"
  export OUT PYTHONUNBUFFERED=1 NWOR_LAB_CACHE_DIR=${NWOR_LAB_CACHE_DIR:-/tmp/nwor_ext}
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
}

stage() { echo "=== $1 (t = $(( $(date +%s) - START )) s)"; }

gpu_device() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch
try:
    import triton; t = 'triton ' + triton.__version__
except ImportError:
    t = 'no triton'
print('torch', torch.__version__, 'cuda', torch.version.cuda, t)"
    git rev-parse HEAD 2>/dev/null || true; } | tee "$OUT/$1"
  NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  TAG=$(echo "$NAME" | grep -oiE 'h100|h200|a100|l40s|b200' | head -1 | tr 'A-Z' 'a-z'); TAG=${TAG:-gpu}
}

gpu_install() {
  python3 -m pip install -q -e . --no-deps --no-build-isolation > "$OUT/$1" 2>&1 || echo "pip -e failed: PYTHONPATH used"
}

gpu_build() {
  timeout $(lim 150) python3 -c "from nwor_lab.ops import _ext; _ext.load(); print(_ext.build_info())" \
    > "$OUT/$1" 2>&1; echo "extension build exit $?"
}
