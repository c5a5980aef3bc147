#!/bin/bash
# Session 8's queue on this 2-core machine, from a frozen worktree of the commit measured.
# Lines of /tmp/s8/queue:
#   CORPUS:TRIAL_A,TRIAL_B   a 22-minute recipe_study pair, one trial per core
#   train:NAME:ARGS          `python train.py ARGS` (the default run's command), both cores
# Waits while /tmp/s8/hold exists.
cd /tmp/s8/tree
OUT=/tmp/s8/out
PY=/work/main/.venv/bin/python
while true; do
  while [ -e /tmp/s8/hold ] || pgrep -f "recipe_study.py run" > /dev/null; do sleep 5; done
  spec=$(head -1 /tmp/s8/queue); [ -z "$spec" ] && break
  sed -i 1d /tmp/s8/queue
  echo "$(date -u +%H:%M:%S) start $spec" >> /tmp/s8/drive.log
  if [[ $spec == train:* ]]; then
    rest=${spec#train:}; name=${rest%%:*}; args=${rest#*:}
    mkdir -p $OUT/train
    $PY train.py --work-dir $OUT/train/$name $args > $OUT/train/$name.log 2>&1
  else
    corpus=${spec%%:*}; pair=${spec#*:}
    name=$corpus/$(echo "$pair" | tr ',' '+')
    mkdir -p $OUT/$corpus
    $PY benchmarks/recipe_study.py run --corpus $corpus --out $OUT/$name \
       --train-minutes 22 --deadline 1500 --reserved-cores 0 --trials "$pair" > $OUT/$name.log 2>&1
  fi
  echo "$(date -u +%H:%M:%S) end $spec rc=$?" >> /tmp/s8/drive.log
done
