#!/bin/bash
while pgrep -f "drive3.sh|drive.sh" > /dev/null; do sleep 5; done
/tmp/fresh_run/run.sh
cd /tmp/study10/tree
echo "$(date -u +%H:%M:%S) start finalists 22 min" >> /tmp/study10/drive.log
/work/main/.venv/bin/python benchmarks/recipe_study.py run --out /tmp/study10/out22/cpu_ref_a+dropout_0 \
   --train-minutes 22 --deadline 1560 --reserved-cores 0 --trials cpu_ref_a,dropout_0 > /tmp/study10/out22.log 2>&1
echo "$(date -u +%H:%M:%S) end finalists rc=$?" >> /tmp/study10/drive.log
