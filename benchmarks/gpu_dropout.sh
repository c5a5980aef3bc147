#!/usr/bin/env bash
# What dropout and the batch size cost on one GPU (benchmarks/README.md, "One GPU"):
# this package under JAX at the paper's batch without dropout, and at twice the batch;
# the PyTorch reference without dropout. OUT=gpu_results bash benchmarks/gpu_dropout.sh
set -u
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
LOG=$OUT/log_dropout.txt
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
BASE="--preset base --length 64 --no-padding --matmul-size 8192 --rounds 5 --steps 5"
run() { local name=$1; shift; echo "=== $name $(date +%T)" >>"$LOG"; timeout -k 5 100 "$@" >>"$LOG" 2>&1; echo "=== rc=$?" >>"$LOG"; }
run jax_dropout0 python3 benchmarks/train_throughput.py --backends jax $BASE --batch-size 384 \
  --dtype mixed_bfloat16 --candidates keras_transformer --dropout 0 --json "$OUT/jax_dropout0.json"
run torch_dropout0 python3 benchmarks/torch_reference.py $BASE --batch-size 384 --dropout 0 \
  --json "$OUT/torch_dropout0.json"
run jax_batch768 python3 benchmarks/train_throughput.py --backends jax $BASE --batch-size 768 \
  --dtype mixed_bfloat16 --candidates keras_transformer --json "$OUT/jax_batch768.json"
grep "^|\|===\|Error" "$LOG"
