#!/usr/bin/env bash
# CPU per dispatch of the bench process, interleaved: cpu.sh OUT ROUNDS VIA TASKS BIN_BEFORE BIN_AFTER
set -euo pipefail
OUT=$1; ROUNDS=$2; VIA=$3; T=$4; B=$5; A=$6
for r in $(seq "$ROUNDS"); do
  for build in before after; do
    BIN=$B; [ "$build" = after ] && BIN=$A
    L=$(cut -d' ' -f1 /proc/loadavg)
    J=$(mktemp); S=$(mktemp)
    timeout 300 perf stat -e task-clock -x, -o "$S" "$BIN" bench --durable --via "$VIA" --tasks "$T" > "$J"
    MS=$(grep task-clock "$S" | cut -d, -f1)
    python3 - "$J" "$MS" "$T" "$build" "$r" "$VIA" "$L" <<'PY' | tee -a "$OUT"
import json, sys
j, ms, t, build, r, via, load = sys.argv[1:]
d = json.load(open(j))
print(f"{via} round {r} {build}: {float(ms)*1000/int(t):.1f} us CPU/dispatch (bench process task-clock), {d['tasks_per_sec']:.0f}/s, p50 {d['p50_us']} p99 {d['p99_us']} us, load {load}")
PY
    rm -f "$J" "$S"
  done
done
