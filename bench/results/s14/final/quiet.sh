#!/bin/bash
# Session 14's last quiet A/B: after = /tmp/after4 (release build of 72ebe31: drivers spawned
# boxed, the early driver's run scoped, the inbox's room kept, ids written without format!,
# finished rows inserted eight per statement), before = /tmp/before (release build of 5a12532,
# the session's start); each directory also holds the JetStream baseline. Three rounds of
# bench/durable.sh, before then after in each, then ten pairs of the durable stream alone
# (bench/results/s14/ab.sh), nothing else running.
set -u
cd /work/main
R=bench/results/s14/final
A=/tmp/after4
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
bash bench/results/s14/ab.sh 10 100000 $B/switchyard $A/switchyard > $R/pairs.txt
log pairs done
