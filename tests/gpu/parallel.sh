#!/usr/bin/env bash
# Several GPU scripts at once on a multi-GPU machine, one per card: each job sees only its card
# (CUDA_VISIBLE_DEVICES), writes under $OUT/<n>/ and builds the extension in its own cache (two
# JIT builds into one folder would race). The project is installed once, before the jobs start.
#   usage (repo root):  OUT=/path bash tests/gpu/parallel.sh "state_run.sh" "tree_run.sh" \
#                           "tree_engine_run.sh A" "serve_run.sh; tree_engine_run.sh B"
# A job is a ';'-separated list of tests/gpu scripts (with arguments, and VAR=value before the
# name, e.g. "BUDGET=200 serve_run.sh") run one after the other on its card; each script's own deadline (BUDGET, seconds) applies, JOB_BUDGET (default 540) bounds the job.
set -uo pipefail
OUT=${OUT:-/tmp/nwor_out}
mkdir -p "$OUT"
cards=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$#" -le "$cards" ] || { echo "parallel.sh: $# jobs for $cards cards: give at most one job per card" >&2; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/cards.txt"
python3 -m pip install -q -e . --no-deps --no-build-isolation > "$OUT/pip.log" 2>&1 || echo "pip -e failed: PYTHONPATH used"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
n=0
for job in "$@"; do
  mkdir -p "$OUT/$n"
  ( export CUDA_VISIBLE_DEVICES=$n OUT="$OUT/$n" NWOR_LAB_CACHE_DIR=/tmp/nwor_ext_$n
    IFS=';' read -ra steps <<< "$job"
    for s in "${steps[@]}"; do
      read -ra argv <<< "$s"
      envs=(); while [[ "${argv[0]}" == *=* ]]; do envs+=("${argv[0]}"); argv=("${argv[@]:1}"); done
      echo "=== card $n: ${envs[*]} ${argv[*]} (t = $SECONDS s)"
      env "${envs[@]}" timeout "${JOB_BUDGET:-540}" bash "tests/gpu/${argv[0]}" "${argv[@]:1}"
      echo "=== card $n: ${argv[0]} exit $? (t = $SECONDS s)"
    done ) > "$OUT/$n/job.log" 2>&1 &
  n=$((n + 1))
  sleep 5
done
wait
for i in $(seq 0 $((n - 1))); do echo "##### card $i"; tail -c 2500 "$OUT/$i/job.log"; done
# What comes back from a lent machine is a few files: everything is packed into one archive
# (KEEP_FILES=1 leaves the files as they are).
if [ -z "${KEEP_FILES:-}" ]; then
  tar czf /tmp/parallel_out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/parallel_out.tgz "$OUT/all.tgz"
  ls -la "$OUT"
fi
