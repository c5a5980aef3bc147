#!/bin/bash
# After /tmp/s11/chain.sh: the onnx split's unit tests (seconds), then the 30k sample's
# must-show pairs (the defaults of the filing against the rules of now) on this slower Zen 3.
S=/tmp/s11
while pgrep -f /tmp/s11/chain.sh > /dev/null; do sleep 5; done
cd /work/main && echo "$(date -u +%H:%M:%S) tests" >> $S/drive.log
.venv/bin/python -m pytest -q tests/test_onnx_passes.py > $S/test_onnx_passes.log 2>&1
echo "$(date -u +%H:%M:%S) tests rc=$?" >> $S/drive.log
cd $S/tree
run() {  # corpus trials
  mkdir -p $S/out/$1
  name=${2/,/+}
  echo "$(date -u +%H:%M:%S) start $1:$2" >> $S/drive.log
  /work/main/.venv/bin/python benchmarks/recipe_study.py run --corpus $1 --out $S/out/$1/$name \
     --train-minutes 22 --deadline 1650 --reserved-cores 0 --trials $2 > $S/out/$1/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $1:$2 rc=$?" >> $S/drive.log
}
run pairs30k as_filed,cpu_ref_a
run pairs30k as_filed_b,cpu_ref_b
