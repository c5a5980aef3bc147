#!/bin/bash
# Issue 54, must show 2: the rules of now (cpu_ref_a/_b: FFN 512, dropout ramped by the passes)
# against the defaults when the issue was filed (as_filed/_b: FFN 1024, dropout 0.1), one
# trial per core, 22 minutes, each pair alone, from a worktree of commit 8447195.
cd /tmp/s10/tree
run_pair() {  # corpus a b
  mkdir -p /tmp/s10/out/$1
  echo "$(date -u +%H:%M:%S) start $1:$2,$3" >> /tmp/s10/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus $1 --out /tmp/s10/out/$1/$2+$3 \
     --train-minutes 22 --deadline 1650 --reserved-cores 0 --trials $2,$3 > /tmp/s10/out/$1/$2+$3.log 2>&1
  echo "$(date -u +%H:%M:%S) end $1 rc=$?" >> /tmp/s10/drive.log
}
run_pair pairs30k as_filed cpu_ref_a
run_pair pairs30k as_filed_b cpu_ref_b
run_pair sentences as_filed cpu_ref_a
run_pair sentences as_filed_b cpu_ref_b
