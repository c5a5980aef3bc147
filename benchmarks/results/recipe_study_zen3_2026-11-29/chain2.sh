#!/bin/bash
# After /tmp/s9/chain.sh: the 30k-pair sample's pair with the first seed (1234), one trial per core.
while pgrep -f /tmp/s9/chain.sh > /dev/null; do sleep 5; done
cd /tmp/s9/tree
mkdir -p /tmp/s9/out/pairs30k
echo "$(date -u +%H:%M:%S) start pairs30k:cpu_ref_a,d_ff_512" >> /tmp/s9/drive.log
/work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus pairs30k --out /tmp/s9/out/pairs30k/cpu_ref_a+d_ff_512 \
   --train-minutes 22 --deadline 1650 --reserved-cores 0 --trials cpu_ref_a,d_ff_512 > /tmp/s9/out/pairs30k/cpu_ref_a+d_ff_512.log 2>&1
echo "$(date -u +%H:%M:%S) end pairs30k rc=$?" >> /tmp/s9/drive.log
