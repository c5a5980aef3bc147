#!/bin/bash
# Session of 2026-11-29 (08:17-): the 30k sample's cooldown pair, then the 100k sample's second seed.
S=/tmp/s11
cd $S/tree
run() {  # corpus trials
  mkdir -p $S/out/$1
  name=${2/,/+}
  echo "$(date -u +%H:%M:%S) start $1:$2" >> $S/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus $1 --out $S/out/$1/$name \
     --train-minutes 22 --deadline 1650 --reserved-cores 0 --trials $2 > $S/out/$1/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $1:$2 rc=$?" >> $S/drive.log
}
run pairs30k cooldown_0.2,cpu_ref_a
run pairs100k as_filed_b,cpu_ref_b
