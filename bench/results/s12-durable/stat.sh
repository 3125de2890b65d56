#!/usr/bin/env bash
# Per-dispatch counts of the bench process, interleaved builds:
#   stat.sh OUT ROUNDS VIA TASKS NAME=BIN [NAME=BIN ...] [-- extra bench args]
# perf stat: task-clock, context switches, fdatasync/fsync, futex and pwrite64 syscalls;
# plus the bench's own JSON (rate, p50/p99, CPU per dispatch).
# PREFIX (e.g. "chrt -f 1") runs the bench under it.
set -euo pipefail
OUT=$1; ROUNDS=$2; VIA=$3; T=$4; shift 4
BUILDS=(); EXTRA=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; EXTRA=("$@"); break; fi
  BUILDS+=("$1"); shift
done
EV=task-clock,context-switches,syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync,syscalls:sys_enter_futex,syscalls:sys_enter_pwrite64
for r in $(seq "$ROUNDS"); do
  for b in "${BUILDS[@]}"; do
    name=${b%%=*}; BIN=${b#*=}
    L=$(cut -d' ' -f1 /proc/loadavg)
    J=$OUT.$name.$r.json; S=$(mktemp)
    timeout 300 perf stat -e "$EV" -x, -o "$S" ${PREFIX:-} "$BIN" bench --durable --via "$VIA" --tasks "$T" "${EXTRA[@]}" > "$J"
    python3 - "$J" "$S" "$T" "$name" "$r" "$VIA" "$L" <<'PY' | tee -a "$OUT"
import json, sys
j, s, t, name, r, via, load = sys.argv[1:]
t = int(t)
d = json.load(open(j))
c = {}
for line in open(s):
    p = line.strip().split(",")
    if len(p) > 2 and p[0] and p[0][0].isdigit():
        c[p[2]] = float(p[0])
f = c.get("syscalls:sys_enter_fdatasync", 0) + c.get("syscalls:sys_enter_fsync", 0)
print(f"{via} r{r} {name}: {d['tasks_per_sec']:.0f}/s p50 {d['p50_us']} p99 {d['p99_us']} us | "
      f"task-clock {c['task-clock']*1000/t:.1f} us/d | ctxsw {c['context-switches']/t:.2f}/d | "
      f"fsyncs {f:.0f} ({t/max(f,1):.1f} d/fsync) | futex {c['syscalls:sys_enter_futex']/t:.2f}/d | "
      f"pwrite {c['syscalls:sys_enter_pwrite64']/t:.2f}/d | load {load}")
PY
    rm -f "$S"
  done
done
