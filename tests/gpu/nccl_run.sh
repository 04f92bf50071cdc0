#!/usr/bin/env bash
# The hand-off across two GPUs over NCCL (two-card machine: nvidia-h200-x2): today_run.sh's `nccl` part —
# tests/gpu/test_gpu_handoff_nccl.py, then bench disagg on the 8B shape over NCCL with warmed, interleaved
# repeats and one profiled round -> $OUT/disagg_8b_nccl_<card>x2.json (both cards named).
#   usage (repo root, >= 2 GPUs):  OUT=/path bash tests/gpu/nccl_run.sh
exec bash "$(dirname "$0")/today_run.sh" nccl
