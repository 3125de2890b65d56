#!/usr/bin/env bash
# Cluster mode beside NATS request/reply (docs/benchmarks.md, "Cluster mode"), interleaved
# ROUNDS times so drift on a shared machine hits both alike:
#   - nats:    NATS request/reply, W workers in one queue group (bench/baselines `nats`),
#   - cluster: `switchyard bench --cluster NODES`, which measures three phases in one run:
#              single (a node without [cluster]), local (workers on the producer's node 1 of
#              the cluster) and cross (producer on node 1, workers on nodes 2..NODES), each
#              with the NATS messages it caused (nats-server's /varz before and after),
# all with the same knobs (W workers, C slots each, P outstanding, B payload bytes, N tasks).
# The baseline uses the nats-server started here; the cluster bench starts its own (the same
# program, with JetStream and a monitoring port) and reports each process's CPU per dispatch.
# Every run's JSON goes to bench/results/cluster/<config>-<round>.json, the load average before
# each run to bench/results/cluster/load.txt, and a Markdown table of medians (min-max) to
# stdout and bench/results/cluster/summary.md.
#
# nats-server must be installed (Debian: apt-get install -y nats-server); this script starts
# it on NATS_PORT and stops it on exit, and installs nothing.
# Knobs (environment): NODES (3), WORKERS (4), CAPACITY (64), OUTSTANDING (256),
# TASKS (200000), PAYLOAD (64), ROUNDS (3), NATS_PORT (14233), RUN_TIMEOUT (600, seconds per run),
# RESULTS (bench/results/cluster), BEFORE_BIN (unset; a directory holding another build's
# `switchyard`: each round then also runs its cluster bench, between the baseline and this
# build's, and the summary adds its rows as "before ...", for an interleaved A/B),
# NODE_THREADS (unset; the worker threads of each node's runtime, `--node-worker-threads`:
# a number, `share` or `inherit`; unset, the bench's default `share`, each node's share of the
# machine's cores; for this build's cluster runs only: the baseline, the bench process and
# BEFORE_BIN's runs get no flag).
# Binaries: $BIN (default $CARGO_TARGET_DIR/release, or target/release) must hold `switchyard`
# and `switchyard-baselines`:
#   cargo build --release --locked -p switchyard --bin switchyard
#   (cd bench/baselines && cargo build --release --locked)   # same CARGO_TARGET_DIR
# Bounded: N is capped by both programs, every run has a timeout, the bench stops the nodes it
# starts (also on a signal), and nats-server is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
SWITCHYARD=$BIN/switchyard
BASELINES=$BIN/switchyard-baselines
NODES=${NODES:-3}
WORKERS=${WORKERS:-4}
CAPACITY=${CAPACITY:-64}
OUTSTANDING=${OUTSTANDING:-256}
TASKS=${TASKS:-200000}
PAYLOAD=${PAYLOAD:-64}
ROUNDS=${ROUNDS:-3}
NATS_PORT=${NATS_PORT:-14233}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
RESULTS=${RESULTS:-$ROOT/bench/results/cluster}
BEFORE_BIN=${BEFORE_BIN:-}
NODE_THREADS=${NODE_THREADS:-}

. "$ROOT/bench/lib/nats.sh"
bench_preflight "$SWITCHYARD" "$BASELINES" ${BEFORE_BIN:+"$BEFORE_BIN/switchyard"}
start_nats

KNOBS=(--workers "$WORKERS" --capacity "$CAPACITY" --outstanding "$OUTSTANDING"
       --tasks "$TASKS" --payload "$PAYLOAD")
mkdir -p "$RESULTS"
: >"$RESULTS/load.txt"
CONFIGS=(nats cluster)
if [[ -n $BEFORE_BIN ]]; then
    CONFIGS=(nats before cluster)
fi
for round in $(seq "$ROUNDS"); do
    for config in "${CONFIGS[@]}"; do
        case $config in
            nats) command=("$BASELINES" nats --server "127.0.0.1:$NATS_PORT" "${KNOBS[@]}") ;;
            # The bench starts a nats-server of its own (the same program), so it can
            # also report that server's CPU time per dispatch.
            cluster) command=("$SWITCHYARD" bench --cluster "$NODES" "${KNOBS[@]}"
                              ${NODE_THREADS:+--node-worker-threads "$NODE_THREADS"}) ;;
            before) command=("$BEFORE_BIN/switchyard" bench --cluster "$NODES" "${KNOBS[@]}") ;;
        esac
        echo "round $round $config: load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RESULTS/load.txt" >&2
        echo "round $round: ${command[*]}" >&2
        timeout "$RUN_TIMEOUT" "${command[@]}" >"$RESULTS/$config-$round.json"
    done
done

python3 - "$RESULTS" "$ROUNDS" "${BEFORE_BIN:+before}" <<'PY' | tee "$RESULTS/summary.md"
import json, statistics, sys

results, rounds = sys.argv[1], int(sys.argv[2])
def load(config):
    out = []
    for n in range(1, rounds + 1):
        with open(f"{results}/{config}-{n}.json") as f:
            out.append(json.load(f))
    return out

nats, cluster = load("nats"), load("cluster")
before = load("before") if len(sys.argv) > 3 and sys.argv[3] else None
runs = {"nats": nats}
for phase in ("single", "local", "cross"):
    if before:
        runs[f"before {phase}"] = [r[phase] for r in before]
    runs[f"cluster {phase}"] = [r[phase] for r in cluster]

def cell(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "n/a"
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"

count = lambda v: f"{v:,.0f}"
print(f"nodes: {cluster[0]['nodes']}, nats-server {cluster[0].get('nats_version')}")
print()
print("| configuration | tasks/s | p50 µs | p99 µs | max µs | machine CPU µs/task | NATS msgs/dispatch | load 1m |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name, reports in runs.items():
    get = lambda field: [r.get(field) for r in reports]
    print(f"| {name} | {cell(get('tasks_per_sec'), count)} | {cell(get('p50_us'), count)} "
          f"| {cell(get('p99_us'), count)} | {cell(get('max_us'), count)} "
          f"| {cell(get('cpu_us_per_dispatch'), lambda v: f'{v:.1f}')} "
          f"| {cell(get('nats_messages_per_dispatch'), lambda v: f'{v:.3f}')} "
          f"| {cell(get('load_average_1m'), lambda v: f'{v:.1f}')} |")

def ratio(a, fa, b, fb):
    """Per-round ratio (same round, so the same drift), median and min-max."""
    values = [x[fa] / y[fb] for x, y in zip(runs[a], runs[b]) if x.get(fa) and y.get(fb)]
    return cell(values, lambda v: f"{v:.2f}×")

print()
print("| machine CPU µs per dispatch, by process | " + " | ".join(("single", "local", "cross")) + " |")
print("| --- | --- | --- | --- |")
names = sorted({n for r in cluster for p in ("single", "local", "cross")
                for n in r[p].get("cpu_us_per_dispatch_by_process", {})},
               key=lambda n: (n not in ("bench", "single", "n1"), n))
for name in names:
    cells = [cell([r[p].get("cpu_us_per_dispatch_by_process", {}).get(name) for r in cluster],
                  lambda v: f"{v:.1f}") for p in ("single", "local", "cross")]
    print(f"| {name} | " + " | ".join(cells) + " |")
if before:
    print()
    print("| CPU µs per dispatch, cross phase, by process | before | after |")
    print("| --- | --- | --- |")
    for name in names:
        cells = [cell([r["cross"].get("cpu_us_per_dispatch_by_process", {}).get(name) for r in runs_],
                      lambda v: f"{v:.1f}") for runs_ in (before, cluster)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    # Per round, the same round's before and after side by side (the load moves between
    # rounds, much less within one), and the median of the per-round ratios.
    def cpu(report, name):
        split = report["cross"].get("cpu_us_per_dispatch_by_process", {})
        return sum(split.values()) if name == "all processes" else split.get(name)
    print()
    print("| CPU µs per dispatch, cross phase, before → after | "
          + " | ".join(f"round {n}" for n in range(1, rounds + 1)) + " | after ÷ before |")
    print("| --- |" + " --- |" * (rounds + 1))
    for name in names + ["all processes"]:
        cells, ratios = [], []
        for b, a in zip(before, cluster):
            bv, av = cpu(b, name), cpu(a, name)
            if bv and av:
                cells.append(f"{bv:.1f} → {av:.1f}")
                ratios.append(av / bv)
            else:
                cells.append("n/a")
        print(f"| {name} | " + " | ".join(cells) + f" | {cell(ratios, lambda v: f'{v:.2f}×')} |")

# The cross phase's tail per round (a stall shows as a max of seconds in one round).
print()
print("| cross-node, per round | " + " | ".join(f"round {n}" for n in range(1, rounds + 1)) + " |")
print("| --- |" + " --- |" * rounds)
for label, reports in ([("before", before)] if before else []) + [("after" if before else "cluster", cluster)]:
    for field in ("p99_us", "max_us"):
        cells = [f"{r['cross'][field]:,}" if r["cross"].get(field) is not None else "n/a"
                 for r in reports]
        print(f"| {label} {field} | " + " | ".join(cells) + " |")

print()
print("| ratio (per round) | median (min–max) |")
print("| --- | --- |")
for label, a, fa, b, fb in [
    ("local path ÷ single node, throughput", "cluster local", "tasks_per_sec", "cluster single", "tasks_per_sec"),
    ("cross-node ÷ NATS request/reply, throughput", "cluster cross", "tasks_per_sec", "nats", "tasks_per_sec"),
] + ([
    ("before: cross-node ÷ NATS request/reply, throughput", "before cross", "tasks_per_sec", "nats", "tasks_per_sec"),
    ("after ÷ before, cross-node throughput", "cluster cross", "tasks_per_sec", "before cross", "tasks_per_sec"),
] if before else []) + [
    ("cross-node ÷ NATS request/reply, p99", "cluster cross", "p99_us", "nats", "p99_us"),
    ("cross-node ÷ NATS request/reply, CPU per task", "cluster cross", "cpu_us_per_dispatch", "nats", "cpu_us_per_dispatch"),
    ("cross-node ÷ single node, CPU per task", "cluster cross", "cpu_us_per_dispatch", "cluster single", "cpu_us_per_dispatch"),
]:
    print(f"| {label} | {ratio(a, fa, b, fb)} |")
PY
