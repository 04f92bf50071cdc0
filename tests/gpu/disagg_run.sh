#!/usr/bin/env bash
# The prefill-to-decode hand-off on one GPU: the CUDA IPC tests (tests/gpu/test_gpu_handoff_ipc.py), then
# `nwor-lab bench disagg --model 8b --transport cuda_ipc` (Llama-3-8B shape, random bf16 weights, an
# EAGLE-3-shaped head, forced acceptance: two processes, both engines on the one card, ~17 GB each),
# 8 prompts x 512 tokens, 32 new tokens, k = 4, write policies off and stage, strategies nwor and
# write_all (no_head is left out: under forced acceptance the acceptance is the profile's, so the
# head's missing K/V shows in nothing this bench reads). At most ~9 minutes.
# Writes $OUT/disagg_8b_<card>.json and logs; copy the JSON to benchmarks/results/.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/disagg_run.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_begin 540
stage setup
gpu_device device_disagg.txt
gpu_install pip_disagg.log

stage "pytest tests/gpu/test_gpu_handoff_ipc.py"
timeout $(lim 180) python3 -m pytest -q -m gpu tests/gpu/test_gpu_handoff_ipc.py -p no:cacheprovider \
  > "$OUT/test_gpu_handoff_ipc.log" 2>&1
echo "pytest exit $?"; tail -3 "$OUT/test_gpu_handoff_ipc.log"

stage "bench disagg --model 8b --transport cuda_ipc"
timeout $(lim 330) python3 -m nwor_lab.bench.disagg --model 8b --device cuda --transport cuda_ipc \
  --strategies nwor,write_all --nwor off,stage --prompts 8 --prompt-len 512 --max-new-tokens 32 --k 4 \
  --out "$OUT/disagg_8b_$TAG.json" > "$OUT/disagg_8b.log" 2>&1
echo "bench disagg exit $?"; tail -8 "$OUT/disagg_8b.log" | cut -c1-400
stage done
