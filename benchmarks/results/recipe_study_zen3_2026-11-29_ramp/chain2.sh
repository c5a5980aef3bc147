#!/bin/bash
# After /tmp/s10/chain.sh: the 100k-pair sample's pair with the first seed.
while pgrep -f /tmp/s10/chain.sh > /dev/null; do sleep 5; done
cd /tmp/s10/tree
mkdir -p /tmp/s10/out/pairs100k
echo "$(date -u +%H:%M:%S) start pairs100k:as_filed,cpu_ref_a" >> /tmp/s10/drive.log
/work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus pairs100k --out /tmp/s10/out/pairs100k/as_filed+cpu_ref_a \
   --train-minutes 22 --deadline 1650 --reserved-cores 0 --trials as_filed,cpu_ref_a > /tmp/s10/out/pairs100k/as_filed+cpu_ref_a.log 2>&1
echo "$(date -u +%H:%M:%S) end pairs100k rc=$?" >> /tmp/s10/drive.log
