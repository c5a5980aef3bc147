#!/bin/bash
# Session of 2026-11-29 (12:07-): dropout 0.2, then 0.05, against the ramp's 0.1 on the 30k sample
# at about 10 passes (MIN=28 on this Zen 3). The first queue ran `dropout_0.2,cpu_ref_a`; its
# `dropout_0.2_b,cpu_ref_b` was stopped after 3 minutes, as 0.2 had lost 3.7 chrF on seed 1234;
# so was the 0.05 queue's second pair (0.05 had lost 2.9), and a third queue ran
# `batch_512,cpu_ref_a` alone; a fourth (S=/tmp/s13) `dropout_0.05_b,cpu_ref_b`.
S=/tmp/s12
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
run pairs30k dropout_0.05,cpu_ref_a
run pairs30k dropout_0.05_b,cpu_ref_b
