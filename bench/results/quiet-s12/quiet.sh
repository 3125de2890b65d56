#!/bin/bash
# Session 12's quiet runs after the merges: after = /work/reltarget/release (main after the
# merges), before = /tmp/before-s12 (release build of ed9309b, the session's start).
set -u
cd /work/main
R=bench/results/quiet-s12
mkdir -p $R
A=/work/reltarget/release
B=/tmp/before-s12
log() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $*" | tee -a $R/run.log; }
log start
# 1. durable, before and after interleaved per round (each bench/durable.sh call is one round)
for round in 1 2 3; do
  for which in before after; do
    bin=$A; [ $which = before ] && bin=$B
    RESULTS=$PWD/$R/durable-$which-$round BIN=$bin ROUNDS=1 TASKS=100000 CONFIGS="jetstream durable-stream durable-submit" bench/durable.sh > $R/durable-$which-$round.out 2>&1
    log durable $which $round done
  done
done
# 2. cluster, before and after in each round (the script interleaves them), 3 rounds
RESULTS=$PWD/$R/cluster BIN=$A BEFORE_BIN=$B TASKS=100000 ROUNDS=3 bench/cluster.sh > $R/cluster.out 2>&1
log cluster done
