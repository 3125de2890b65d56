#!/usr/bin/env bash
# Per-dispatch process counters of `switchyard bench` (the whole process: producer, in-process
# gateway and workers), one line per run: label, load, then perf stat's CSV.
# Usage: stat.sh OUT LABEL BIN [bench flags...]
set -euo pipefail
out=$1; label=$2; bin=$3; shift 3
events=task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter,\
syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmsg,\
syscalls:sys_enter_recvmmsg,syscalls:sys_enter_write,syscalls:sys_enter_writev,\
syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,\
sched:sched_wakeup
load=$(cut -d' ' -f1 /proc/loadavg)
tmp=$(mktemp)
perf stat -x, -o "$tmp" -e "$events" "$bin" bench "$@" > "$tmp.json"
{
  echo "## $label load=$load args=$*"
  cat "$tmp.json"; echo
  grep -v '^#' "$tmp" | grep -v '^$'
} >> "$out"
rm -f "$tmp" "$tmp.json"
