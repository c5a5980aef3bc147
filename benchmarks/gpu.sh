#!/usr/bin/env bash
# The one-GPU measurements of benchmarks/README.md ("One GPU"), in one command that
# fits a 10-minute slot:
#
#   OUT=gpu_results bash benchmarks/gpu.sh
#
# 1. the PyTorch reference (benchmarks/torch_reference.py: nn.Transformer, bf16
#    autocast, torch.compile) and, in one JAX process, this package with its own
#    attention and with keras.ops.dot_product_attention, and the keras-hub build:
#    `base`, 384 x 64 real tokens a side (24,576, the paper's ~25k), mixed_bfloat16;
#    one table with MFU against the 989 TFLOP/s data-sheet peak and the measured one;
# 2. train.py on Ding under JAX for a few minutes (the `small` preset), whose work
#    directory comes back in 15 MB pieces (`cat ding_small.tar.part-* | tar x`)
#    for a CPU machine to export;
# 3. this package under Keras's torch backend, with what time is left.
#
# STEPS="ding" (any of: jax jax_dropout jax_rbg torch_reference torch_fair
# torch_fair_graphs ding torch_backend) runs only those. Everything takes more than
# one 10-minute slot: run it as three calls, STEPS="jax jax_dropout jax_rbg", then
# STEPS="torch_reference torch_fair torch_fair_graphs", then STEPS="ding torch_backend"
# (about 8, 9 and 5 minutes; more than one session's 15 minutes of device time).
#
# On a machine without TensorFlow or Keras (the lent GPU machine), wheels in .whl/
# (keras, keras-hub, namex, optree, kagglehub, kagglesdk) are installed to
# /tmp/site first, and the Ding file is read from .corpus/de-en. The Ding run
# trains from a work directory prepared elsewhere with the same command plus
# --prepare-only (vocabulary; the shards are rewritten here in seconds).
set -u
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
LOG=$OUT/log.txt
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi

STEPS=${STEPS:-"jax jax_dropout jax_rbg torch_reference torch_fair torch_fair_graphs ding torch_backend"}
step() {  # step NAME SECONDS COMMAND...: runs COMMAND under a time limit, logged
  local name=$1 limit=$2
  shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  echo "=== $name $(date +%T) (limit ${limit}s): $*" >>"$LOG"
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name rc=$? $(date +%T)" >>"$LOG"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$LOG" 2>&1
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)" >>"$LOG" 2>&1

BASE=${BASE:-"--preset base --batch-size 384 --length 64 --no-padding --matmul-size 8192"}
step jax 170 python3 benchmarks/train_throughput.py --backends jax $BASE --dtype mixed_bfloat16 \
  --candidates keras_transformer,keras_transformer_fused,keras_hub --rounds 5 --steps 5 \
  --peak-tflops 989 --json "$OUT/throughput_jax.json"
# Dropout's share of the step: without dropout, and with its masks from RngBitGenerator.
step jax_dropout 150 python3 benchmarks/train_throughput.py --backends jax $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 5 --steps 5 --dropout 0 \
  --peak-tflops 989 --json "$OUT/throughput_jax_dropout0.json"
step jax_rbg 150 python3 benchmarks/train_throughput.py --backends jax $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 5 --steps 5 \
  --dropout-bits rbg --peak-tflops 989 --json "$OUT/throughput_jax_rbg.json"
step torch_reference 140 python3 benchmarks/torch_reference.py $BASE --rounds 5 --steps 5 \
  --json "$OUT/torch_reference.json"
# The tuned reference (SDPA with is_causal, the Keras builds' dropout only, the loss
# compiled with the model), plain torch.compile and with CUDA graphs; 10 rounds of 25.
step torch_fair 200 python3 benchmarks/torch_reference.py $BASE --variant fair --rounds 10 \
  --steps 25 --json "$OUT/torch_reference_fair.json"
step torch_fair_graphs 200 python3 benchmarks/torch_reference.py $BASE --variant fair \
  --compile-mode reduce-overhead --rounds 10 --steps 25 \
  --json "$OUT/torch_reference_fair_graphs.json"

DING=${DING:-.gpu/ding_small}
DING_MINUTES=${DING_MINUTES:-2}
step ding 220 env KERAS_BACKEND=jax python3 train.py --preset small --vocab-size 8000 \
  --ding-path .corpus/de-en --work-dir "$DING" --batch-tokens 8192 --warmup-steps 1000 \
  --steps 500 --epochs 100 --max-train-minutes "$DING_MINUTES" --validation-bleu-every 0 \
  --test-samples 1000 --dtype-policy mixed_bfloat16 --no-export
if [[ " $STEPS " == *" ding "* ]]; then  # the run, less its shards and checkpoints, in pieces
  tar -C "$(dirname "$DING")" --exclude data --exclude backup --exclude checkpoints \
    -cf - "$(basename "$DING")" | split -b 15m - "$OUT/ding_small.tar.part-"
fi

step torch_backend 50 python3 benchmarks/train_throughput.py --backends torch $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 3 --steps 3 \
  --peak-tflops 989 --json "$OUT/throughput_torch.json"
python3 benchmarks/train_throughput.py --table "$OUT"/throughput_*.json "$OUT"/torch_reference*.json \
  --peak-tflops 989 >>"$LOG" 2>&1
grep -v "^W0000\|^I0000" "$LOG" | tail -80
