#!/bin/bash
# Issue 53 Must show 2 and issue 52 Must show 1's quiet rerun, run alone on the machine.
# The model: /tmp/bench (python train.py --work-dir /tmp/bench/work --max-train-minutes 12
# --no-export, cpu preset, 3,000 steps), exported at 444bf26 (before) and a62a8bc (after).
set -x
OUT=/work/main/benchmarks/results/serve_workers_zen4_2026-11-27
PY=/work/main/.venv/bin/python
M=/tmp/bench/after/m
cd /work/main
lscpu > $OUT/cpu.txt
uptime > $OUT/uptime.txt
for engine in onnx ctranslate2; do
  for precision in float32 int8; do
    for workers in 1 2; do
      threads=$((2 / workers))
      extra=""; [ $engine = ctranslate2 ] && extra="--no-direct"
      $PY benchmarks/serve_load.py $M/$engine --clients 1 8 32 128 --seconds 12 \
        --signatures serving_default translate_greedy --workers $workers --threads $threads \
        --engine $engine --precision $precision $extra \
        --json $OUT/grid_${engine}_${precision}_w${workers}.json > $OUT/grid_${engine}_${precision}_w${workers}.txt 2>&1
      uptime >> $OUT/uptime.txt
    done
  done
done
$PY benchmarks/serve_load.py $M/onnx --clients 128 --seconds 600 --workers 2 --threads 1 \
  --kill-worker-every 120 --json $OUT/soak.json > $OUT/soak.txt 2>&1
uptime >> $OUT/uptime.txt
touch $OUT/grid.done
S=/work/main/benchmarks/results/serving_steps_zen4_2026-11-27
for t in 1 2; do
  for side in before after; do
    ( uptime; $PY benchmarks/serving.py --model-dir /tmp/bench/$side/m --threads $t --rounds 5 --batch-sizes 1,8,64; uptime ) > $S/quiet_${side}_threads$t.txt 2>&1
  done
done
touch $OUT/serving.done
