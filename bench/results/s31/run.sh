#!/usr/bin/env bash
# Interleaves the NATS request/reply baseline with several `bench --cluster 3` configurations,
# round by round (session 31; paths as on the machine it ran on). Spec: "NAME|BINARY|EXTRA ARGS|ENV=V ...".
# usage: ROUNDS=n OUT=dir exp2.sh "NAME|BIN|EXTRA ARGS|ENV=V ..." ...
set -uo pipefail
BL=/work/reltarget/release/switchyard-baselines
ROUNDS=${ROUNDS:-3}; OUT=${OUT:-/tmp/expout}; TASKS=${TASKS:-100000}
mkdir -p $OUT
nats-server -a 127.0.0.1 -p 14299 > $OUT/nats.log 2>&1 & NP=$!
sleep 1
K="--workers 4 --capacity ${CAP:-64} --outstanding ${OUTST:-256} --tasks $TASKS --payload 64 ${SVC:-}"
for r in $(seq $ROUNDS); do
  timeout 300 $BL nats --server 127.0.0.1:14299 $K > $OUT/nats-$r.json
  for spec in "$@"; do
    IFS='|' read -r name bin extra envs <<< "$spec"
    env X=1 $envs timeout 300 $bin bench --cluster 3 $K $extra > $OUT/$name-$r.json 2>$OUT/$name-$r.err
  done
done
kill $NP
python3 - $OUT $ROUNDS "$@" <<'PY'
import json,sys,statistics as st
out,R=sys.argv[1],int(sys.argv[2]); names=[s.split('|')[0] for s in sys.argv[3:]]
nats=[json.load(open(f"{out}/nats-{r}.json"))['tasks_per_sec'] for r in range(1,R+1)]
print("nats", [round(x) for x in nats])
for n in names:
    rs=[json.load(open(f"{out}/{n}-{r}.json")) for r in range(1,R+1)]
    cr=[x['cross'] for x in rs]
    ratios=[x['tasks_per_sec']/y for x,y in zip(cr,nats)]
    lr=[x['local']['tasks_per_sec']/x['single']['tasks_per_sec'] for x in rs]
    cpu={k: round(st.median([x['cpu_us_per_dispatch_by_process'][k] for x in cr]),2) for k in cr[0]['cpu_us_per_dispatch_by_process']}
    print(f"{n:10s} ratio med {st.median(ratios):.3f} {[round(x,2) for x in ratios]} tps {round(st.median([x['tasks_per_sec'] for x in cr]))} p99 {st.median([x['p99_us'] for x in cr])} max {max(x['max_us'] for x in cr)} msgs {st.median([x['nats_messages_per_dispatch'] for x in cr]):.4f} local/single {st.median(lr):.2f} sum {sum(cpu.values()):.2f} {cpu}")
PY
