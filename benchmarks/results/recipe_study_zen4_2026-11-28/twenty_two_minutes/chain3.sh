#!/bin/bash
# The shipped rule (commit e578531) on the 100k-pair sample: the preset's two reference
# seeds, whose dropout the measured step now picks; after chain2.sh's pairs, alone.
cd /tmp/s7/tree3
OUT=/tmp/s7/out/new_rule/pairs100k
mkdir -p $OUT
while pgrep -f "chain2.sh|recipe_study.py run" > /dev/null; do sleep 5; done
echo "$(date -u +%H:%M:%S) start new_rule pairs100k:cpu_ref_a,cpu_ref_b" >> /tmp/s7/drive.log
/work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus pairs100k --out $OUT/cpu_ref_a+cpu_ref_b \
   --train-minutes 22 --deadline 1500 --reserved-cores 0 --trials cpu_ref_a,cpu_ref_b > $OUT/cpu_ref_a+cpu_ref_b.log 2>&1
echo "$(date -u +%H:%M:%S) end new_rule rc=$?" >> /tmp/s7/drive.log
