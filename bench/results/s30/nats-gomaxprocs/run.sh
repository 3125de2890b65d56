#!/bin/bash
# Session 30: NATS request/reply and cross-node with nats-server at its default GOMAXPROCS
# (def) and at GOMAXPROCS=1 (gmp1), interleaved, 4 rounds. Build: c7cf10f, release.
# Usage: B=<dir with switchyard and switchyard-baselines> OUT=<dir> run.sh
B=${B:-/work/reltarget/release}
OUT=${OUT:-$(dirname "$0")}
K="--workers 4 --capacity 64 --outstanding 256 --tasks 100000 --payload 64"
for r in 1 2 3 4; do
  for cfg in def gmp1; do
    if [ $cfg = def ]; then NS=nats-server; else NS="$(dirname "$0")"/nats1; fi
    if [ $cfg = def ]; then nats-server -p 14299 -a 127.0.0.1 >/dev/null 2>&1 & else GOMAXPROCS=1 nats-server -p 14299 -a 127.0.0.1 >/dev/null 2>&1 & fi
    NP=$!; sleep 0.5
    timeout 120 $B/switchyard-baselines nats --server 127.0.0.1:14299 $K > "$OUT"/nats-$cfg-$r.json
    kill $NP; wait $NP 2>/dev/null
    timeout 300 $B/switchyard bench --cluster 3 $K --nats-server $NS > "$OUT"/cluster-$cfg-$r.json 2>/dev/null
    echo "$r $cfg done" >&2
  done
done
