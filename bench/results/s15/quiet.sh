#!/bin/bash
# Session 15's quiet A/B: before = /tmp/s15/before (release build of edc7595, the session's
# start), after = /tmp/s15/after (release build of 8eb20d7: the task shared with the store's
# writer, the driver's notes without a channel, holdable writes that do not wake the writer,
# the outcome awaited first); each directory also holds the JetStream baseline. Five rounds of
# bench/durable.sh, before then after in each, then ten pairs of the durable stream alone
# (bench/results/s14/ab.sh), nothing else running.
set -u
cd /work/main
R=bench/results/s15
A=/tmp/s15/after
B=/tmp/s15/before
log() { echo "== $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) $*" | tee -a $R/run.log; }
log start
for round in 1 2 3 4 5; do
  for which in before after; do
    bin=$A; [ $which = before ] && bin=$B
    RESULTS=$PWD/$R/durable-$which-$round BIN=$bin ROUNDS=1 TASKS=100000 CONFIGS="jetstream durable-stream durable-submit ephemeral-stream" bench/durable.sh > $R/durable-$which-$round.out 2>&1
    log durable $which $round done
  done
done
bash bench/results/s14/ab.sh 10 100000 $B/switchyard $A/switchyard > $R/pairs.txt
log pairs done
