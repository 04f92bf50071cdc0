#!/usr/bin/env bash
# ncu counters of verify attention's window variant (stage: the window from the staging buffer)
# against its cache variant (off / cow), before and after the tail split and the query bound, at
# the 8B layer's shape, batch 1 / 16 / 64, 5-token windows (nwor_lab/bench/attention_variants.py).
#   usage (repo root, GPU machine):  OUT=/some/dir bash tests/gpu/ncu_verify_attention.sh [batches]
# Writes under $OUT/ncu_verify_attention/:
#   verify_attention_variants.json  kernel µs (CUDA-graph replays, round-robin), registers / spills /
#                                   shared memory per compiled variant (Triton), window/cache ratios
#   ncu_manifest.json               the profiled launches, in order
#   verify_attention.ncu-rep        the ncu report (open it in Nsight Compute)
#   ncu_raw.csv                     its raw page; ncu_verify_attention.json: joined, with ratios
# About 1-2 minutes on an H100 (Triton compiles 6 variants once; ncu replays 12 launches).
set -uo pipefail
# DEADLINE (epoch seconds, optional): every step's timeout is cut to end before it
source "$(dirname "$0")/deadline.sh"
OUT=${OUT:-/tmp/nwor_out}
D=$OUT/ncu_verify_attention
mkdir -p "$D"
BATCHES=${1:-1,16,64}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
METRICS=gpu__time_duration.sum,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,\
launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,\
sm__maximum_warps_per_active_cycle_pct,sm__warps_active.avg.pct_of_peak_sustained_active,\
dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,\
smsp__inst_executed.sum,smsp__sass_inst_executed_op_local_ld.sum,smsp__sass_inst_executed_op_local_st.sum

echo "--- timings (no profiler)"
timeout $(lim 240) python3 -m nwor_lab.bench.attention_variants --batches "$BATCHES" --out "$D" \
  > "$D/timings.log" 2>&1; echo "timings exit $?"; tail -20 "$D/timings.log"

if [ -z "$NCU" ]; then echo "ncu not found: counters skipped"; exit 0; fi
echo "--- ncu ($NCU)"
run_ncu() {   # $@: what to collect
  timeout $(lim 300) "$NCU" --profile-from-start off -k regex:_verify_attention_kernel "$@" \
    --export "$D/verify_attention" --force-overwrite \
    python3 -m nwor_lab.bench.attention_variants --profile --batches "$BATCHES" --out "$D" > "$D/ncu.log" 2>&1
}
run_ncu --metrics "$METRICS"; rc=$?
if [ $rc -ne 0 ]; then   # a counter this ncu does not know: fall back to its standard sections
  echo "ncu with the metric list exit $rc; retrying with sections"; tail -5 "$D/ncu.log"
  run_ncu --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis; rc=$?
fi
echo "ncu exit $rc"
"$NCU" --import "$D/verify_attention.ncu-rep" --csv --page raw > "$D/ncu_raw.csv" 2> "$D/ncu_import.log"
python3 -m nwor_lab.bench.attention_variants --join-ncu "$D/ncu_raw.csv" --out "$D" > "$D/join.log" 2>&1
echo "join exit $?"; cat "$D/join.log" | head -80
