#!/usr/bin/env bash
# The one-GPU measurements of benchmarks/README.md ("One GPU"), in priority order,
# each step under its own time limit and all of them under one deadline, results
# written to $OUT as each step ends:
#
#   OUT=gpu_results DEADLINE=540 bash benchmarks/gpu.sh
#
# Steps (STEPS="..." picks some, in this order):
#   probe             the GPU, JAX/torch versions, ONNX Runtime's providers, the CUDA
#                     libraries CTranslate2 loads (benchmarks/gpu_serving.py's probe)
#   jax               this package under JAX and the keras-hub build: `base`,
#                     384 x 64 real tokens a side (24,576, the paper's ~25k),
#                     mixed_bfloat16, with MFU against the 989 TFLOP/s data sheet and a
#                     measured 8192^3 bf16 matmul
#   torch_fair, torch_fair_graphs, torch_reference
#                     the PyTorch references (benchmarks/torch_reference.py): tuned
#                     (SDPA, the Keras builds' dropout only, loss compiled in), the same
#                     with CUDA graphs, and plain nn.Transformer under torch.compile
#   jax_fused         the same with keras.ops.dot_product_attention (cuDNN's flash kernel)
#   jax_rbg, jax_dropout   dropout's share: masks from RngBitGenerator, and no dropout
#   torch_backend     this package under Keras's torch backend
#   ding              train.py on Ding under JAX (the `small` preset, DING_MINUTES),
#                     with the GPU's busy share sampled by nvidia-smi, JAX's compile log
#                     and a py-spy profile of the host; the work directory comes back in
#                     15 MB pieces (`cat ding_small.tar.part-* | tar x`) to export on a CPU
#   base_train        train.py with the `base` preset at 25,000-token batches (BASE_MINUTES)
#   serve             the Ding run's model served on the GPU (benchmarks/gpu_serving.py)
# Each step's limit is cut to what is left before the deadline (seconds after the
# start; default 570) and a step with under 30 s left is skipped, so a device call of
# DEADLINE + 30 s returns every finished step. Measured on an H100 (2026-11-27): probe
# 19 s, jax 114, torch_fair 63, torch_fair_graphs 56, torch_reference 60, jax_rbg 63,
# jax_dropout 52, torch_backend 18, ding at DING_MINUTES=1 172; with base_train and
# serve, about 17 minutes in all: more than one session's device time. Two calls:
# STEPS="probe jax torch_fair torch_fair_graphs torch_reference jax_rbg jax_dropout"
# (DEADLINE=480), then STEPS="jax_fused torch_backend ding base_train serve".
#
# On a machine without TensorFlow or Keras (the lent GPU machine), wheels in .whl/
# (keras, keras-hub, namex, optree, kagglehub, kagglesdk, py-spy) are installed to
# /tmp/site first, and the Ding file is read from .corpus/de-en (or unpacked from
# .corpus/de-en.gz). The Ding runs train from work directories prepared elsewhere with
# the same commands plus --prepare-only (the vocabulary; the shards are rewritten there
# in seconds): .gpu/ding_small and .gpu/ding_base.
set -u
OUT=${OUT:-gpu_results}
mkdir -p "$OUT"
LOG=$OUT/log.txt
START=$SECONDS
DEADLINE=${DEADLINE:-570}
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
if [[ ! -f .corpus/de-en && -f .corpus/de-en.gz ]]; then gunzip -k .corpus/de-en.gz; fi

STEPS=${STEPS:-"probe jax jax_fused torch_fair torch_fair_graphs torch_reference jax_rbg jax_dropout torch_backend ding base_train serve"}
wants() { [[ " $STEPS " == *" $1 "* ]]; }
step() {  # step NAME SECONDS COMMAND...: COMMAND under min(SECONDS, time left), logged
  local name=$1 limit=$2 left
  shift 2
  wants "$name" || return 0
  left=$((DEADLINE - (SECONDS - START) - 15))
  if ((left < 30)); then echo "=== $name skipped: ${left}s left before the deadline" >>"$LOG"; return 0; fi
  ((limit > left)) && limit=$left
  echo "=== $name $(date +%T) (limit ${limit}s): $*" >>"$LOG"
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name rc=$? $(date +%T) ($((SECONDS - START))s in)" >>"$LOG"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$LOG" 2>&1
python3 -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)" >>"$LOG" 2>&1
step probe 60 env KERAS_BACKEND=jax python3 -c "import json; from benchmarks.gpu_serving import probe; print(json.dumps(probe()))"

BASE=${BASE:-"--preset base --batch-size 384 --length 64 --no-padding --matmul-size 8192"}
# Two builds per process: three (with the fused attention) outran 170 s on an H100.
step jax 170 python3 benchmarks/train_throughput.py --backends jax $BASE --dtype mixed_bfloat16 \
  --candidates keras_transformer,keras_hub --rounds 5 --steps 5 \
  --peak-tflops 989 --json "$OUT/throughput_jax.json"
# The tuned reference (SDPA with is_causal, the Keras builds' dropout only, the loss
# compiled with the model), with CUDA graphs, and plain nn.Transformer; 5 rounds of 25.
step torch_fair 120 python3 benchmarks/torch_reference.py $BASE --variant fair --rounds 5 \
  --steps 25 --json "$OUT/torch_reference_fair.json"
step torch_fair_graphs 130 python3 benchmarks/torch_reference.py $BASE --variant fair \
  --compile-mode reduce-overhead --rounds 5 --steps 25 \
  --json "$OUT/torch_reference_fair_graphs.json"
step torch_reference 100 python3 benchmarks/torch_reference.py $BASE --rounds 5 --steps 5 \
  --json "$OUT/torch_reference.json"
# Dropout's share of the step: its masks from RngBitGenerator, and without dropout.
step jax_fused 120 python3 benchmarks/train_throughput.py --backends jax $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer_fused --rounds 5 --steps 5 \
  --peak-tflops 989 --json "$OUT/throughput_jax_fused.json"
step jax_rbg 90 python3 benchmarks/train_throughput.py --backends jax $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 5 --steps 5 \
  --dropout-bits rbg --peak-tflops 989 --json "$OUT/throughput_jax_rbg.json"
step jax_dropout 90 python3 benchmarks/train_throughput.py --backends jax $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 5 --steps 5 --dropout 0 \
  --peak-tflops 989 --json "$OUT/throughput_jax_dropout0.json"
step torch_backend 60 python3 benchmarks/train_throughput.py --backends torch $BASE \
  --dtype mixed_bfloat16 --candidates keras_transformer --rounds 3 --steps 3 \
  --peak-tflops 989 --json "$OUT/throughput_torch.json"
if ls "$OUT"/throughput_*.json "$OUT"/torch_reference*.json >/dev/null 2>&1; then
  python3 benchmarks/train_throughput.py --table "$OUT"/throughput_*.json \
    "$OUT"/torch_reference*.json --peak-tflops 989 >>"$LOG" 2>&1
fi

# train.py on Ding. While it trains: nvidia-smi samples the GPU's busy share every
# 200 ms (utilization.gpu: the time a kernel ran), JAX logs each compilation, and
# py-spy samples the host's Python stacks for 30 s of the steady state.
ding_run() {  # ding_run WORK_DIR MINUTES TRAIN_ARGS...: train.py with the samplers beside it
  local work=$1 minutes=$2 name
  name=$(basename "$work")
  shift 2
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader \
    -lms 200 >"$OUT/${name}_gpu_busy.csv" 2>/dev/null &
  local sampler=$! trainer
  trap 'kill $trainer $sampler 2>/dev/null; exit 124' TERM  # the step's time limit
  JAX_LOG_COMPILES=1 KERAS_BACKEND=jax python3 train.py --ding-path .corpus/de-en \
    --work-dir "$work" --max-train-minutes "$minutes" --validation-bleu-every 0 \
    --dtype-policy mixed_bfloat16 --no-export "$@" 2>"$OUT/${name}_stderr.txt" &
  trainer=$!
  if command -v py-spy >/dev/null; then
    (sleep "${PROFILE_AFTER:-50}" && py-spy record --pid "$trainer" --duration 30 --rate 50 \
      --nonblocking --idle --format raw --output "$OUT/${name}_py_spy.txt" >/dev/null 2>&1) &
  fi
  wait "$trainer"
  local rc=$?
  kill "$sampler" 2>/dev/null
  grep -c "Compiling\|Finished XLA compilation" "$OUT/${name}_stderr.txt" | sed 's/^/compile log lines: /'
  grep -v "^W0000\|^I0000\|Compiling\|Finished\|Tracing\|Lowering" "$OUT/${name}_stderr.txt" | tail -25
  cp "$work/run.json" "$OUT/${name}_run.json" 2>/dev/null
  return $rc
}
export -f ding_run
export OUT
DING_MINUTES=${DING_MINUTES:-2}
step ding 220 bash -c 'ding_run "$@"' ding_run .gpu/ding_small "$DING_MINUTES" --preset small --vocab-size 8000 \
  --batch-tokens 8192 --warmup-steps 1000 --steps 500 --epochs 100 --test-samples 1000
if wants ding && [[ ${DING_TAR:-0} == 1 && -d .gpu/ding_small ]]; then  # the run, in pieces
  tar -C .gpu --exclude data --exclude backup --exclude checkpoints -cf - ding_small \
    | split -b 15m - "$OUT/ding_small.tar.part-"
fi
BASE_MINUTES=${BASE_MINUTES:-1.5}
step base_train 170 env PROFILE_AFTER=60 bash -c 'ding_run "$@"' ding_run .gpu/ding_base \
  "$BASE_MINUTES" --preset base --batch-tokens 25000 --steps 100 --epochs 100 --test-samples 100
step serve 150 env KERAS_BACKEND=jax python3 benchmarks/gpu_serving.py --work-dir .gpu/ding_small \
  --corpus .corpus/de-en --batch-sizes 1,64 --beam-sizes 4 --rounds 3 --max-seconds 120 \
  --json "$OUT/serving_gpu.json"
# At most 8 files come back from a device call: every result but the log in one archive.
(cd "$OUT" && ls | grep -v "^log.txt$\|^results.tar.gz$\|^files.txt$\|\.tar\.part-" >files.txt \
  && tar -czf results.tar.gz -T files.txt && xargs rm -f <files.txt && rm -f files.txt)
grep -v "^W0000\|^I0000" "$LOG" | tail -80
