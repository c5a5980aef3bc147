#!/bin/bash
# Session of 2026-11-29 (15:40-): late dropout (--dropout-start) against the ramp's 0.1 on the
# 30k sample at about 10 passes (MIN=28 on this Zen 3), one pair a launch:
# `MIN=28 chain.sh late_dropout_0.5,cpu_ref_a`, then `late_dropout_0.3,cpu_ref_a`.
S=/tmp/s14
MIN=${MIN:-22}
cd $S/tree
run() {  # corpus trials
  mkdir -p $S/out/$1
  name=${2/,/+}
  echo "$(date -u +%H:%M:%S) start $1:$2 ($MIN minutes)" >> $S/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus $1 --out $S/out/$1/$name \
     --train-minutes $MIN --deadline $((MIN * 60 + 330)) --reserved-cores 0 --trials $2 > $S/out/$1/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $1:$2 rc=$?" >> $S/drive.log
}
run pairs30k "$1"
