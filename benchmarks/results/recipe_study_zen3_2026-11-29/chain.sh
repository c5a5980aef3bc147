#!/bin/bash
cd /tmp/s9/tree
PY=/work/main/.venv/bin/python
for spec in "default_seed4321:--seed 4321" "d_ff_512_seed4321:--seed 4321 --d-ff 512"; do
  name=${spec%%:*}; args=${spec#*:}
  echo "$(date -u +%H:%M:%S) start $name $args" >> /tmp/s9/drive.log
  $PY train.py --no-export --work-dir /tmp/s9/out/$name $args > /tmp/s9/out/$name.log 2>&1
  echo "$(date -u +%H:%M:%S) end $name rc=$?" >> /tmp/s9/drive.log
done
