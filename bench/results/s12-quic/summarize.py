#!/usr/bin/env python3
"""Per-dispatch figures from stat.sh output: one row per run, then medians per label."""
import json, re, statistics, sys
from collections import defaultdict

runs = []
for block in open(sys.argv[1]).read().split("## ")[1:]:
    head, _, rest = block.partition("\n")
    label = head.split()[0]
    load = float(re.search(r"load=([\d.]+)", head).group(1))
    tasks = int(re.search(r"--tasks (\d+)", head).group(1))
    body = rest.strip().splitlines()
    js = json.loads(body[0])
    counters = {}
    for line in body[1:]:
        f = line.split(",")
        if len(f) > 3 and f[0] and f[0][0].isdigit():
            counters[f[2]] = float(f[0])
    per = lambda k: counters.get(k, 0) / tasks
    runs.append({
        "label": label, "load": load, "tasks_per_sec": js.get("tasks_per_sec"),
        "p99_us": js.get("p99_us"), "machine_cpu_us": js.get("cpu_us_per_dispatch"),
        "task_clock_us": counters.get("task-clock", 0) * 1000 / tasks,  # msec -> us
        "ctx_sw": per("context-switches"), "syscalls": per("raw_syscalls:sys_enter"),
        "sendmsg": per("syscalls:sys_enter_sendmsg"), "recvmmsg": per("syscalls:sys_enter_recvmmsg"),
        "recvmsg": per("syscalls:sys_enter_recvmsg"),
        "write+writev": per("syscalls:sys_enter_write") + per("syscalls:sys_enter_writev"),
        "read": per("syscalls:sys_enter_read"), "epoll_wait": per("syscalls:sys_enter_epoll_wait"),
        "futex": per("syscalls:sys_enter_futex"), "wakeups": per("sched:sched_wakeup"),
    })
cols = ["tasks_per_sec", "p99_us", "machine_cpu_us", "task_clock_us", "ctx_sw", "syscalls",
        "sendmsg", "recvmmsg", "recvmsg", "write+writev", "read", "epoll_wait", "futex", "wakeups"]
print("| label | load | " + " | ".join(cols) + " |")
print("|" + " --- |" * (len(cols) + 2))
for r in runs:
    print(f"| {r['label']} | {r['load']} | " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) and r[c] < 100 else f"{r[c]:.0f}" for c in cols) + " |")
print()
by = defaultdict(list)
for r in runs:
    by[r["label"]].append(r)
print("medians (min-max):")
print("| label | n | " + " | ".join(cols) + " |")
print("|" + " --- |" * (len(cols) + 2))
for label, rs in by.items():
    cells = []
    for c in cols:
        v = [r[c] for r in rs if r[c] is not None]
        m = statistics.median(v)
        fmt = (lambda x: f"{x:.3f}") if m < 100 else (lambda x: f"{x:.0f}")
        cells.append(f"{fmt(m)} ({fmt(min(v))}-{fmt(max(v))})")
    print(f"| {label} | {len(rs)} | " + " | ".join(cells) + " |")
# per-round ratios of task-clock, tuned / default and quic-default / grpc
labels = [r["label"] for r in runs]
if "quic-tuned" in by and "quic-default" in by:
    ratios = [t["task_clock_us"] / d["task_clock_us"] for d, t in zip(by["quic-default"], by["quic-tuned"])]
    print("\nquic-tuned / quic-default task-clock per round:", " ".join(f"{x:.2f}" for x in ratios),
          "median", f"{statistics.median(ratios):.2f}")
    ratios = [t["tasks_per_sec"] / d["tasks_per_sec"] for d, t in zip(by["quic-default"], by["quic-tuned"])]
    print("quic-tuned / quic-default throughput per round:", " ".join(f"{x:.2f}" for x in ratios),
          "median", f"{statistics.median(ratios):.2f}")
if "grpc" in by and "quic-default" in by:
    ratios = [q["task_clock_us"] / g["task_clock_us"] for g, q in zip(by["grpc"], by["quic-default"])]
    print("quic-default / grpc task-clock per round:", " ".join(f"{x:.2f}" for x in ratios),
          "median", f"{statistics.median(ratios):.2f}")
