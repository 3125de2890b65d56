#!/bin/bash
# Session 15: QUIC via stream with quinn's defaults and with the tuning (`send_fairness` off,
# `ack_eliciting_threshold` 8 on the in-process gateway and the bench's workers), beside NATS
# request/reply and gRPC via stream, interleaved, ROUNDS rounds (release build in BIN).
set -u
cd /work/main
R=bench/results/s15/quic
BIN=${BIN:-/work/reltarget/release}
ROUNDS=${ROUNDS:-5}
mkdir -p $R
KNOBS="--workers 4 --capacity 64 --outstanding 256 --tasks 200000 --payload 64"
nats-server -p 14391 > $R/nats-server.log 2>&1 &
NATS=$!
trap 'kill $NATS 2>/dev/null' EXIT
sleep 1
for round in $(seq $ROUNDS); do
  timeout 300 $BIN/switchyard-baselines nats --server 127.0.0.1:14391 $KNOBS > $R/nats-$round.json 2>/dev/null
  timeout 300 $BIN/switchyard bench --transport grpc --via stream $KNOBS > $R/grpc-$round.json 2>/dev/null
  timeout 300 $BIN/switchyard bench --transport quic --via stream $KNOBS > $R/quic-default-$round.json 2>/dev/null
  timeout 300 $BIN/switchyard bench --transport quic --via stream --quic-send-fairness false --quic-ack-threshold 8 $KNOBS > $R/quic-tuned-$round.json 2>/dev/null
  echo "round $round done $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
done
python3 - $R $ROUNDS <<'PY'
import json,sys,statistics as st
R,n=sys.argv[1],int(sys.argv[2])
rows={}
for c in ['nats','grpc','quic-default','quic-tuned']:
    rows[c]=[json.load(open(f'{R}/{c}-{i}.json')) for i in range(1,n+1)]
def med(xs): return st.median(xs),min(xs),max(xs)
print('| configuration | tasks/s | p99 µs | machine CPU µs/task | ÷ NATS (per round) |')
print('| --- | --- | --- | --- | --- |')
for c,rs in rows.items():
    t=med([r['tasks_per_sec'] for r in rs]); p=med([r['p99_us'] for r in rs]); u=med([r['cpu_us_per_dispatch'] for r in rs])
    ratio=[r['tasks_per_sec']/q['tasks_per_sec'] for r,q in zip(rs,rows['nats'])]
    print(f"| {c} | {t[0]:,.0f} ({t[1]:,.0f}–{t[2]:,.0f}) | {p[0]:,} ({p[1]:,}–{p[2]:,}) | {u[0]:.1f} ({u[1]:.1f}–{u[2]:.1f}) | {' '.join('%.2f'%x for x in ratio)} (median {st.median(ratio):.2f}) |")
PY
