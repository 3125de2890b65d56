#!/bin/bash
# Session 14's quiet A/B: after = /tmp/after3 (release build of main after this session's two commits: drivers spawned boxed,
# the early driver's run scoped, the inbox's room kept), before = /tmp/before (release build of 5a12532, the session's
# start); each directory also holds the JetStream baseline. Three rounds, before then after
# in each, nothing else running.
set -u
cd /work/main
R=bench/results/s14
A=/tmp/after3
B=/tmp/before
log() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $*" | tee -a $R/run.log; }
log start
for round in 1 2 3; do
  for which in before after; do
    bin=$A; [ $which = before ] && bin=$B
    RESULTS=$PWD/$R/durable-$which-$round BIN=$bin ROUNDS=1 TASKS=100000 CONFIGS="jetstream durable-stream durable-submit ephemeral-stream" bench/durable.sh > $R/durable-$which-$round.out 2>&1
    log durable $which $round done
  done
done
# Scaling (issue 18): gRPC via stream on 1 core and on 2, the after build, five rounds.
for round in 1 2 3 4 5; do
  for cpus in 0 0,1; do
    taskset -c $cpus $A/switchyard bench --transport grpc --via stream --workers 4 --capacity 64 \
        --tasks 200000 --outstanding 256 --payload 64 --service-time-us 0 > $R/scaling-$round-$cpus.json 2>/dev/null
  done
  log scaling $round done
done
