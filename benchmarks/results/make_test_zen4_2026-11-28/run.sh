#!/bin/bash
# A fresh clone's `make test`, install included, timed per step (issue 55, Must show 3).
set -u
LOG=/tmp/fresh_run
rm -rf /tmp/fresh && git clone -q /work/main /tmp/fresh && cd /tmp/fresh || exit 1
git log --oneline -1 > $LOG/commit.txt
lscpu > $LOG/lscpu.txt
stamp() { echo "$(date -u +%FT%T) $*" >> $LOG/steps.txt; }
stamp start install
/usr/bin/time -f "%e s wall, %M KB max RSS" make install > $LOG/install.log 2>&1; stamp "end install rc=$?"
stamp start test
make test > $LOG/make_test.log 2>&1; stamp "end test rc=$?"
touch $LOG/done
