#!/usr/bin/env bash
# Speed before and after a change of the engine room: the graphed 8B step (bench step) and bench serve
# closed loop at 8 and 32 clients, an older tree (OLD: `git archive <commit> nwor_lab csrc setup.py
# pyproject.toml` extracted, e.g. under .ab/old, carried to the device) against this one. The step bench
# runs A B B A (each run's own repeats inside); serve runs B A with --repeats 3 (ABBA inside each).
#   usage (repo root, GPU machine): OLD=.ab/old OUT=/path bash tests/gpu/speed_ab.sh [step|serve|all|split]
# split (a two-card machine): the extension built once (csrc is shared by both trees), then the step runs on
# card 0 while serve runs on card 1 (each comparison stays on its own card). SERVE_LIM: seconds per serve run.
set -uo pipefail
PART=${1:-all}
source "$(dirname "$0")/common.sh"
gpu_begin 560
stage setup
gpu_device "device_speed_$PART.txt"
OLD=$(cd "${OLD:?OLD: the extracted older tree}" && pwd)
NEW=$PWD
step() {  # step TREE TAG [extra flags]
  local tree=$1 tag=$2; shift 2
  (cd "$tree" && PYTHONPATH=$tree timeout $(lim 110) python3 -m nwor_lab.bench.step --models 8b --batches 1,16,64 --ks 4 \
     --rates 0.5 --json --out "$OUT/step_$tag.json" "$@" > "$OUT/step_$tag.log" 2>&1); echo "step $tag exit $? (t = $(( $(date +%s) - START )) s)"
}
serve() {  # serve TREE TAG
  (cd "$1" && PYTHONPATH=$1 timeout $(lim ${SERVE_LIM:-170}) python3 -m nwor_lab.bench.serve --model 8b --device cuda \
     --configs target,eagle3:4 --k-max 4 --policies stage --concurrency 8,32 --prompt-len 64 --output-len 256 \
     --repeats 3 --components 32 --quiet --out "$OUT/serve_$2.json" > "$OUT/serve_$2.log" 2>&1); echo "serve $2 exit $? (t = $(( $(date +%s) - START )) s)"
}
if [ "$PART" = split ]; then
  stage build; gpu_build ext_build.log
  stage "card 0: step A B B A | card 1: serve B A"
  ( export CUDA_VISIBLE_DEVICES=0; step "$NEW" new1; step "$OLD" old1; step "$OLD" old2; step "$NEW" new2 ) &
  ( export CUDA_VISIBLE_DEVICES=1; serve "$OLD" old1; serve "$NEW" new1 ) &
  wait; stage done; exit 0
fi
if [ "$PART" != serve ]; then
  stage "step A B B A"; step "$NEW" new1; step "$OLD" old1; step "$OLD" old2; step "$NEW" new2
fi
if [ "$PART" != step ]; then
  stage "serve B A"; serve "$OLD" old1; serve "$NEW" new1
fi
stage done
