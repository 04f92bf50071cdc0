#!/usr/bin/env bash
# compute-sanitizer over the lab's Triton kernels (tests/gpu/test_gpu_sanitize.py: every kernel and
# compile-time variant once, at small shapes): memcheck over all of them (exact allocations:
# PyTorch's caching allocator off), racecheck over the same run (the fused ops and the attention
# kernels). Counts go to $OUT/sanitize/sanitize.json, logs beside it.
#   usage (repo root, GPU machine):  OUT=/some/dir bash tests/gpu/sanitize.sh
# About 2-4 minutes on an H100: a first run outside the sanitizer compiles the Triton variants
# (Triton's cache then serves the sanitized runs, so they only pay for the kernels).
set -uo pipefail
# DEADLINE (epoch seconds, optional): every step's timeout is cut to end before it
source "$(dirname "$0")/deadline.sh"
OUT=${OUT:-/tmp/nwor_out}
D=$OUT/sanitize
mkdir -p "$D"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
SEL=tests/gpu/test_gpu_sanitize.py
PYTEST="python3 -m pytest -q -p no:cacheprovider $SEL"

timeout $(lim 240) $PYTEST > "$D/plain.log" 2>&1; echo "plain (compile) exit $?"; tail -2 "$D/plain.log"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $(lim 300) "$SAN" --tool memcheck --print-limit 50 $PYTEST \
  > "$D/memcheck.log" 2>&1; echo "memcheck exit $?"
# racecheck: every kernel of the selection in one run (the Triton kernels' shared memory: tl.dot
# operands, reductions; the torch reference kernels come along, which are small here)
timeout $(lim 240) "$SAN" --tool racecheck --print-limit 20 $PYTEST > "$D/racecheck.log" 2>&1
echo "racecheck exit $?"
python3 - "$D" <<'PY'
import json, re, sys
from pathlib import Path
d = Path(sys.argv[1])
out = {}
for log in sorted(d.glob("*.log")):
    text = log.read_text(errors="replace")
    row = {"pytest": (re.findall(r"^=*\s*(\d+ (?:passed|failed).*?)\s*=*$", text, re.M) or ["?"])[-1]}
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    if m:
        row["errors"] = int(m.group(1))
    m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
    if m:
        row.update(hazards=int(m.group(1)), errors=int(m.group(2)), warnings=int(m.group(3)))
    out[log.stem] = row
(d / "sanitize.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out, indent=1))
PY
