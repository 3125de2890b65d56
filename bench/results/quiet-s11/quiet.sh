#!/bin/bash
# Quiet-machine figures after the merges: after = /work/reltarget/release, before = /tmp/before-s11.
set -u
cd /work/main
R=bench/results/quiet-s11
mkdir -p $R
A=/work/reltarget/release/switchyard
B=/tmp/before-s11/switchyard
log() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $*" | tee -a $R/run.log; }
log start
# 1. stream A/B, interleaved, 5 rounds: bench JSON lines
for round in 1 2 3 4 5; do
  for t in grpc quic; do
    for which in before after; do
      bin=$A; [ $which = before ] && bin=$B
      out=$($bin bench --transport $t --via stream --tasks 200000 2>/dev/null | tr -d '\n')
      echo "$round $t $which $(uptime | sed 's/.*average: //' | cut -d, -f1) $out" >> $R/stream-ab.txt
    done
  done
done
log stream-ab done
# 2. baselines table, 3 rounds
RESULTS=$PWD/$R/baselines BIN=/work/reltarget/release ROUNDS=3 bench/baselines.sh > $R/baselines.out 2>&1
log baselines done
# 3. cluster, before and after, 3 rounds
RESULTS=$PWD/$R/cluster BIN=/work/reltarget/release BEFORE_BIN=/tmp/before-s11 TASKS=100000 ROUNDS=3 bench/cluster.sh > $R/cluster.out 2>&1
log cluster done
# 4. durable, after then before
RESULTS=$PWD/$R/durable BIN=/work/reltarget/release ROUNDS=3 TASKS=100000 CONFIGS="jetstream durable-stream durable-submit" bench/durable.sh > $R/durable.out 2>&1
log durable after done
RESULTS=$PWD/$R/durable-before BIN=/tmp/before-s11 ROUNDS=3 TASKS=100000 CONFIGS="jetstream durable-stream durable-submit" bench/durable.sh > $R/durable-before.out 2>&1
log durable before done
# 5. scaling, 5 rounds
for round in 1 2 3 4 5; do for cpus in 0 0,1; do
  echo "$round $cpus $(taskset -c $cpus $A bench --transport grpc --via stream --workers 4 --capacity 64 --tasks 200000 --outstanding 256 --payload 64 --service-time-us 0 2>/dev/null | tr -d '\n')" >> $R/scaling.txt
done; done
log scaling done
