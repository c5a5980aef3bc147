#!/bin/bash
# 22-minute pairs on this 2-core machine, one trial per core, from a frozen worktree.
# Takes the first line of /tmp/s7/queue (CORPUS:TRIAL_A,TRIAL_B) until it is empty;
# waits while /tmp/s7/hold exists or another study runs.
cd /tmp/s7/tree2
OUT=/tmp/s7/out
while true; do
  while [ -e /tmp/s7/hold ] || pgrep -f "recipe_study.py run" > /dev/null; do sleep 5; done
  spec=$(head -1 /tmp/s7/queue); [ -z "$spec" ] && break
  sed -i 1d /tmp/s7/queue
  corpus=${spec%%:*}; pair=${spec#*:}
  name=$corpus/$(echo "$pair" | tr ',' '+')
  mkdir -p $OUT/$corpus
  echo "$(date -u +%H:%M:%S) start $spec" >> /tmp/s7/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus $corpus --out $OUT/$name \
     --train-minutes 22 --deadline 1500 --reserved-cores 0 --trials "$pair" > $OUT/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $spec rc=$?" >> /tmp/s7/drive.log
done
