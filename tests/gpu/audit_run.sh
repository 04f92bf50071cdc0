#!/usr/bin/env bash
# `nwor-lab audit --json` on the GPU (one command of at most ~4 minutes; a deadline cuts every stage):
#   tiny (shipped Llama pair)  off, cow, stage; off and stage on a ring of W = 8 slots
#   hybrid (shipped hybrid pair, else the toy)  stage K/V with each state strategy: off, snapshots,
#                               cow, replay, stage
# Every step runs eagerly (the audit's observers keep CUDA graphs off); the state check uses its
# CUDA tolerance (1e-4). Writes $OUT/audit_<card>.jsonl (one line per store and a summary line per
# run, each summary tagged with the card) and audit.log.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/audit_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 240
stage setup
gpu_device device_audit.txt
FILE="$OUT/audit_$TAG.jsonl"
: > "$FILE"
audit() {   # one run: its JSON lines appended, the summary tagged with the card
  timeout $(lim 60) python3 -m nwor_lab.cli audit --json --device cuda --max-new-tokens 24 --prompts 4 "$@" \
    2>> "$OUT/audit.log" | python3 -c "
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get('summary'):
        d['card'] = '$NAME'
        print('   ', d['model'], d['strategy'], d['state_mode'], 'reached', d['stores_reached'], 'divergence',
              d['first_divergence'], file=sys.stderr)
    print(json.dumps(d))" >> "$FILE"
  echo "audit $* exit ${PIPESTATUS[0]}"
}

stage "tiny"
for mode in off cow stage; do audit --model tiny --nwor-mode $mode; done
for mode in off stage; do audit --model tiny --nwor-mode $mode --sliding-window 8 --kv-ring ring; done
stage "hybrid"
for sm in off snapshots cow replay stage; do audit --model hybrid --nwor-mode stage --state-mode $sm; done
stage done
