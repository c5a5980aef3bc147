#!/bin/bash
# 10-minute trials on this 2-core machine, two at a time (one per core), from a frozen worktree.
cd /tmp/study10/tree
OUT=/tmp/study10/out
while pgrep -f "recipe_study.py run" > /dev/null; do sleep 5; done
for pair in "$@"; do
  name=$(echo "$pair" | tr ',' '+')
  echo "$(date -u +%H:%M:%S) start $pair" >> /tmp/study10/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --out $OUT/$name --train-minutes 10 \
     --deadline 840 --reserved-cores 0 --trials "$pair" > $OUT/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $pair rc=$?" >> /tmp/study10/drive.log
done
