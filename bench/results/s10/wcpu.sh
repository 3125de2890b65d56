#!/usr/bin/env bash
# Writer-thread CPU per dispatch over a whole run, from the `store-writer` thread's schedstat
# run time; usage: wcpu.sh BIN VIA TASKS [extra bench flags...]
set -euo pipefail
BIN=$1; VIA=$2; T=$3; shift 3
OUT=$(mktemp)
"$BIN" bench --durable --via "$VIA" --tasks "$T" "$@" > "$OUT" &
P=$!
TID=
for _ in $(seq 400); do
  TID=$(grep -l store-writer /proc/$P/task/*/comm 2>/dev/null | head -1 | cut -d/ -f5) || true
  [ -n "$TID" ] && break; sleep 0.025
done
LAST=0
while kill -0 $P 2>/dev/null; do
  V=$(awk '{print $1}' /proc/$P/task/$TID/schedstat 2>/dev/null) && [ -n "$V" ] && LAST=$V
  sleep 0.02
done
wait $P
python3 -c "import json; r=json.load(open('$OUT')); print(f'{r[\"tasks_per_sec\"]:.0f}/s p50 {r[\"p50_us\"]} p99 {r[\"p99_us\"]} us, cpu {r[\"cpu_us_per_dispatch\"]:.1f} us/dispatch, writer {$LAST/1000/$T:.1f} us/dispatch, load {r[\"load_average_1m\"]}')"
rm -f "$OUT"
