#!/bin/bash
# After the pairs30k pair: `make train` on a fresh clone of main's HEAD (a fresh .venv), alone.
while pgrep -f /tmp/s9/chain2.sh > /dev/null; do sleep 5; done
rm -rf /tmp/s9/fresh; git clone -q /work/main /tmp/s9/fresh
cd /tmp/s9/fresh && git log --oneline -1 >> /tmp/s9/drive.log
echo "$(date -u +%H:%M:%S) start make train (fresh clone)" >> /tmp/s9/drive.log
/usr/bin/time -v make train > /tmp/s9/out/make_train_fresh.log 2>&1
echo "$(date -u +%H:%M:%S) end make train rc=$?" >> /tmp/s9/drive.log
