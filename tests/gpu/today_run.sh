#!/usr/bin/env bash
# Today's GPU runs, one part per 10-minute call (each cut by `lim` to end before its budget), JSON under $OUT
# (at most 7 files a part: the device's limit on what comes back is 8). Written without a GPU.
#   usage (repo root, GPU machine):  OUT=/path bash tests/gpu/today_run.sh PART [PART ...]   (in order, one budget)
#
#   nccl      (two GPUs: nvidia-h200-x2)  the NCCL hand-off: tests/gpu/test_gpu_handoff_nccl.py (prefill on
#             cuda:0, decode on cuda:1, every exact strategy, greedy and T 0.8, off and stage), then bench disagg
#             on the 8B shape over NCCL: 8 prompts x 500 tokens (partial blocks), 32 new, k 4, off and stage,
#             nwor and write_all, 1 warm-up round and 3 interleaved repeats with one engine (on cuda:1), one
#             profiled round -> disagg_8b_nccl_<card>x2.json (both cards named; `overlap`: transfer vs decode)
#   ipc8b     (one GPU)  tests/gpu/test_gpu_handoff_ipc.py (the rounds code now carries it), then the same
#             bench over CUDA IPC with partial blocks -> disagg_8b_partial_<card>.json
#   tier      (one GPU)  the host tier under torch.profiler, off / cow / stage -> tier_profile_<card>.json
#   spans     (one GPU)  the step's host time by piece at 32 clients, target and EAGLE-3 k 4 (stage and off)
#             -> step_spans_8b_<card>.json
#   chain     (one GPU)  the graphed 8B step's kernels at batch 64, off / cow / stage -> chain_kernels_8b_<card>.json
#   profiles  tier, spans and chain (about 9 minutes: `tier chain` then `spans` as two calls is safer)
#   serve08   (one GPU)  bench serve at T 0.8 (8 and 32 clients, target, k 4, k auto; 3 repeats): the run that
#             the budget cut on 2026-11-29 after 8 clients -> serve_8b_t08_prelaunch_<card>.json
#   pairs     (one GPU)  the graphed step's paired ratios at batch 1, 16, 64 after the T > 0 sampler change
#             (T 0.8 over T 0; cow and stage over off; 41 repeats) -> step_pairs_8b_all_<card>.json, and the
#             step's kernels at T 0 against T 0.8 at batch 64 -> t08_kernels_8b_<card>.json
#   buckets   (one GPU)  bench serve at 32 clients (target, k 4; 3 repeats) with the steps with prefills padded to
#             powers of two (--row-steps 1, the rule before) and to 8 buckets a doubling from 128 rows (the new
#             default) -> serve_buckets_s1_<card>.json, serve_buckets_s8_<card>.json (with each engine's graphs,
#             capture seconds and device memory)
#   pool      (one GPU)  the shared prefill graph pool's checks this session could not run: the GPU tests of
#             trees, prefix caching, preemption and the step graph with it, then bench serve at 32 clients with
#             the prefill graphs' pools shared and own (--own-graph-pools), one machine: memory and speed
#             -> serve_pool_shared_<card>.json, serve_pool_own_<card>.json
#   cow64     (one GPU)  cow over off at batch 64, the target this session's ABBA repeats could not settle (they
#             read 1.008 at T 0 and 0.985 at T 0.8 for the same kernels): off and cow alone, 61 repeats in a
#             shuffled order each (--order shuffle), then the same in ABBA -> step_pairs_cow64_<order>_<card>.json
#   servespans (one GPU)  the step's host pieces over serving by kind of step, after the dead riders and the
#             deferred records -> serve_spans_8b_after_<card>.json
#   kauto     (one GPU)  k auto's verdicts: steady and 0.9:0.1:0.9 phases at 8 and 32 clients against target-only
#             and fixed k 3, 4 (3 repeats) -> serve_kauto_8b_<card>.json (about 6 minutes)
#   host      (one GPU)  bench serve at 32 clients with the components timed on the same machine (--components
#             32): the serving decode steps against them -> serve_host_8b_<card>.json (about 2 minutes)
#   softmax   (one GPU)  the sampler's chunked softmax against torch's in CUDA graphs, its GPU tests, and the
#             graphed step's T 0.8 ratios -> softmax_<card>.json, step_pairs_8b_softmax_<card>.json
set -uo pipefail
PARTS=${*:?PART: nccl, ipc8b, tier, spans, chain, profiles, serve08, pairs, buckets, pool, cow64, servespans, kauto, host or softmax}
PARTS=${PARTS/profiles/tier spans chain}
PART=${PARTS// /_}
source "$(dirname "$0")/common.sh"
gpu_begin 575
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # NVLink multicast stays off
stage "setup $PART"
gpu_device "device_$PART.txt"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >> "$OUT/device_$PART.txt"
# the CUDA extension once, before any process uses it (its log with the device's)
timeout $(lim 150) python3 -c "from nwor_lab.ops import _ext; _ext.load(); print(_ext.build_info())" \
  >> "$OUT/device_$PART.txt" 2>&1; echo "extension build exit $?"

disagg() {  # disagg TRANSPORT OUTFILE LIMIT
  timeout $(lim "$3") python3 -m nwor_lab.bench.disagg --model 8b --device cuda --transport "$1" \
    --strategies nwor,write_all --nwor off,stage --prompts 8 --prompt-len 500 --max-new-tokens 32 --k 4 \
    --warmup 1 --repeats 3 --profile "/tmp/disagg_${1}_trace.json" --out "$OUT/$2" > "$OUT/${2%.json}.log" 2>&1
  echo "bench disagg $1 exit $?"; grep -E '^\{' "$OUT/${2%.json}.log" | cut -c1-300 | tail -8
}
tier() {
  timeout $(lim 150) python3 -m nwor_lab.bench.tier_profile --device cuda --nwor off,cow,stage \
    --out "$OUT/tier_profile_$TAG.json" > "$OUT/tier_profile.log" 2>&1
  echo "tier_profile exit $?"; grep -E '^\{' "$OUT/tier_profile.log" | cut -c1-400
}
spans() {
  timeout $(lim 300) python3 -m nwor_lab.bench.step_profile spans --model 8b --clients 32 --nwor stage,off \
    --out "$OUT/step_spans_8b_$TAG.json" > "$OUT/step_spans.log" 2>&1
  echo "step_profile spans exit $?"; grep -E '^\{' "$OUT/step_spans.log" | cut -c1-300
}
chain() {
  timeout $(lim 240) python3 -m nwor_lab.bench.step_profile chain --batch 64 --k 4 --rate 0.5 \
    --out "$OUT/chain_kernels_8b_$TAG.json" > "$OUT/chain_kernels.log" 2>&1
  echo "step_profile chain exit $?"; tail -3 "$OUT/chain_kernels.log" | cut -c1-300
}

for PART in $PARTS; do
case "$PART" in
  nccl)
    [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "nccl: needs two GPUs (kind nvidia-h200-x2)"; continue; }
    stage "pytest tests/gpu/test_gpu_handoff_nccl.py"
    timeout $(lim 220) python3 -m pytest -q -s -rs -m gpu tests/gpu/test_gpu_handoff_nccl.py -p no:cacheprovider \
      > "$OUT/test_gpu_handoff_nccl.log" 2>&1
    echo "pytest exit $?"; grep -E "K/V bytes|passed|failed|skipped" "$OUT/test_gpu_handoff_nccl.log" | tail -6
    stage "bench disagg --transport nccl"
    disagg nccl "disagg_8b_nccl_${TAG}x2.json" 600 ;;
  ipc8b)
    stage "pytest tests/gpu/test_gpu_handoff_ipc.py"
    timeout $(lim 200) python3 -m pytest -q -m gpu tests/gpu/test_gpu_handoff_ipc.py -p no:cacheprovider \
      > "$OUT/test_gpu_handoff_ipc.log" 2>&1
    echo "pytest exit $?"; tail -3 "$OUT/test_gpu_handoff_ipc.log"
    stage "bench disagg --transport cuda_ipc, partial blocks"
    disagg cuda_ipc "disagg_8b_partial_$TAG.json" 600 ;;
  tier) stage tier; tier ;;
  spans) stage spans; spans ;;
  chain) stage chain; chain ;;
  serve08)
    stage "bench serve T 0.8"
    timeout $(lim 300) python3 -m nwor_lab.bench.serve --model 8b --device cuda --configs target,eagle3:4,eagle3:auto \
      --k-max 4 --policies stage --concurrency 8,32 --prompt-len 64 --output-len 256 --repeats 3 --temperature 0.8 \
      --goodput tpot:50 --quiet --out "$OUT/serve_8b_t08_prelaunch_$TAG.json" > "$OUT/serve08.log" 2>&1
    echo "bench serve exit $?" ;;
  pairs)
    stage "step_pairs and the T 0 / T 0.8 kernels"
    timeout $(lim 200) python3 -m nwor_lab.bench.step_pairs --model 8b --batches 64,16,1 --temperatures 0,0.8 \
      --modes off,cow,stage --reps 41 --out "$OUT/step_pairs_8b_all_$TAG.json" > "$OUT/step_pairs.log" 2>&1
    echo "step_pairs exit $?"; grep -E '^\{' "$OUT/step_pairs.log" | cut -c1-300
    timeout $(lim 150) python3 -m nwor_lab.bench.step_profile chain --batch 64 --k 4 --rate 0.5 --temperatures 0,0.8 \
      --out "$OUT/t08_kernels_8b_$TAG.json" > "$OUT/t08_kernels.log" 2>&1
    echo "step_profile chain --temperatures exit $?" ;;
  buckets)
    for steps in 1 8; do
      stage "bench serve --row-steps $steps"
      timeout $(lim 200) python3 -m nwor_lab.bench.serve --model 8b --device cuda --configs target,eagle3:4 \
        --policies stage --concurrency 32 --prompt-len 64 --output-len 256 --repeats 3 --row-steps $steps \
        --goodput tpot:50 --quiet --out "$OUT/serve_buckets_s${steps}_$TAG.json" > "$OUT/buckets_s$steps.log" 2>&1
      echo "bench serve --row-steps $steps exit $?"; grep -E '^\{' "$OUT/buckets_s$steps.log" | cut -c1-200
    done ;;
  pool)
    stage "GPU tests with the shared prefill pool"
    timeout $(lim 240) python3 -m pytest -q -m gpu tests/gpu/test_gpu_tree_engine.py tests/gpu/test_gpu_prefix.py \
      tests/gpu/test_gpu_preemption.py tests/gpu/test_gpu_step_graph.py -p no:cacheprovider > "$OUT/pool_tests.log" 2>&1
    echo "pytest exit $?"; tail -3 "$OUT/pool_tests.log"
    for pools in shared own; do
      stage "bench serve, prefill graph pools: $pools"
      flag=$([ "$pools" = own ] && echo --own-graph-pools)
      timeout $(lim 120) python3 -m nwor_lab.bench.serve --model 8b --device cuda --configs target,eagle3:4 \
        --policies stage --concurrency 32 --prompt-len 64 --output-len 256 --repeats 3 $flag \
        --goodput tpot:50 --quiet --out "$OUT/serve_pool_${pools}_$TAG.json" > "$OUT/pool_$pools.log" 2>&1
      echo "bench serve ($pools) exit $?"
    done ;;
  cow64)
    for order in shuffle abba; do
      stage "step_pairs batch 64, off and cow, $order"
      timeout $(lim 150) python3 -m nwor_lab.bench.step_pairs --model 8b --batches 64 --temperatures 0,0.8 \
        --modes off,cow --reps 61 --order $order --out "$OUT/step_pairs_cow64_${order}_$TAG.json" \
        > "$OUT/cow64_$order.log" 2>&1
      echo "step_pairs ($order) exit $?"; grep -E '^\{' "$OUT/cow64_$order.log" | cut -c1-300
    done ;;
  servespans)
    stage "spans --serve"
    timeout $(lim 200) python3 -m nwor_lab.bench.step_profile spans --serve --model 8b --clients 32 --nwor stage \
      --out "$OUT/serve_spans_8b_after_$TAG.json" > "$OUT/serve_spans.log" 2>&1
    echo "step_profile spans --serve exit $?"; grep -E '^\{' "$OUT/serve_spans.log" | cut -c1-300 ;;
  kauto)
    stage "bench serve k auto, steady and phases"
    timeout $(lim 420) python3 -m nwor_lab.bench.serve --model 8b --device cuda --configs target,eagle3:3,eagle3:4,eagle3:auto \
      --k-max 4 --policies stage --concurrency 8,32 --prompt-len 64 --output-len 256 --repeats 3 --temperature 0 \
      --phases 0.9:0.1:0.9 --goodput tpot:50 --quiet --out "$OUT/serve_kauto_8b_$TAG.json" > "$OUT/kauto.log" 2>&1
    echo "bench serve exit $?" ;;
  host)
    stage "bench serve with the components"
    timeout $(lim 240) python3 -m nwor_lab.bench.serve --model 8b --device cuda --configs target,eagle3:4 --k-max 4 \
      --policies stage --concurrency 32 --prompt-len 64 --output-len 256 --repeats 3 --components 32 \
      --goodput tpot:50 --quiet --out "$OUT/serve_host_8b_$TAG.json" > "$OUT/host.log" 2>&1
    echo "bench serve exit $?" ;;
  softmax)
    stage "softmax: tests, bench, step pairs"
    timeout $(lim 90) python3 -m pytest -q -m gpu tests/gpu/test_gpu_fused.py tests/gpu/test_gpu_sampling_graphs.py \
      -p no:cacheprovider > "$OUT/softmax_tests.log" 2>&1; echo "pytest exit $?"; tail -2 "$OUT/softmax_tests.log"
    timeout $(lim 60) python3 -m nwor_lab.bench.softmax --rows 64,256 --reps 21 --out "$OUT/softmax_$TAG.json" \
      > "$OUT/softmax.log" 2>&1; echo "bench softmax exit $?"
    timeout $(lim 200) python3 -m nwor_lab.bench.step_pairs --model 8b --batches 64,16,1 --temperatures 0,0.8 \
      --modes off,cow,stage --reps 31 --out "$OUT/step_pairs_8b_softmax_$TAG.json" > "$OUT/step_pairs.log" 2>&1
    echo "step_pairs exit $?"; grep -E '^\{' "$OUT/step_pairs.log" | cut -c1-300 ;;
  *) echo "PART=$PART: choose nccl, ipc8b, tier, spans, chain, profiles, serve08, pairs, buckets, pool, cow64, servespans, kauto, host or softmax" ;;
esac
done
stage done
