#!/usr/bin/env bash
# The baselines of docs/benchmarks.md ("Baselines for performance round two") beside
# `switchyard bench`, interleaved ROUNDS times so drift on a shared machine hits every
# configuration alike:
#   - nats:         NATS request/reply, W workers in one queue group (bench/baselines),
#   - echo:         a raw tonic bidi stream, one hop (push a task, get the echo),
#   - relay:        a raw tonic two-hop relay, producer -> relay -> worker -> relay -> producer,
#   - raw-unary-1 / raw-unary-4: a raw tonic unary echo over 1 and 4 connections,
#   - grpc-stream / quic-stream: `switchyard bench --transport grpc|quic --via stream`,
#   - grpc-unary-1 / grpc-unary-4: `switchyard bench --via unary --connections 1|4`,
# all with the same knobs (W workers, C slots each, P outstanding, B payload bytes, N tasks).
# Every run's JSON goes to bench/results/baselines/<config>-<round>.json; a Markdown table of
# medians (min-max) goes to stdout and to bench/results/baselines/summary.md.
#
# nats-server must be installed (Debian: apt-get install -y nats-server); this script starts
# it on NATS_PORT and stops it on exit, and installs nothing.
# Knobs (environment): WORKERS (4), CAPACITY (64), OUTSTANDING (256), TASKS (200000),
# PAYLOAD (64), ROUNDS (3), NATS_PORT (14223), RUN_TIMEOUT (300, seconds per run), RESULTS
# (bench/results/baselines).
# Binaries: $BIN (default $CARGO_TARGET_DIR/release, or target/release) must hold `switchyard`
# and `switchyard-baselines`:
#   cargo build --release --locked -p switchyard --bin switchyard
#   (cd bench/baselines && cargo build --release --locked)   # same CARGO_TARGET_DIR
# Bounded: N is capped by both programs, every run has a timeout, nats-server is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
SWITCHYARD=$BIN/switchyard
BASELINES=$BIN/switchyard-baselines
WORKERS=${WORKERS:-4}
CAPACITY=${CAPACITY:-64}
OUTSTANDING=${OUTSTANDING:-256}
TASKS=${TASKS:-200000}
PAYLOAD=${PAYLOAD:-64}
ROUNDS=${ROUNDS:-3}
NATS_PORT=${NATS_PORT:-14223}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
RESULTS=${RESULTS:-$ROOT/bench/results/baselines}

. "$ROOT/bench/lib/nats.sh"
bench_preflight "$SWITCHYARD" "$BASELINES"
start_nats

KNOBS=(--workers "$WORKERS" --capacity "$CAPACITY" --outstanding "$OUTSTANDING"
       --tasks "$TASKS" --payload "$PAYLOAD")
mkdir -p "$RESULTS"
CONFIGS=(nats echo relay raw-unary-1 raw-unary-4 grpc-stream quic-stream grpc-unary-1
         grpc-unary-4)
for round in $(seq "$ROUNDS"); do
    for config in "${CONFIGS[@]}"; do
        case $config in
            nats) command=("$BASELINES" nats --server "127.0.0.1:$NATS_PORT" "${KNOBS[@]}") ;;
            echo) command=("$BASELINES" echo "${KNOBS[@]}") ;;
            relay) command=("$BASELINES" relay "${KNOBS[@]}") ;;
            raw-unary-1) command=("$BASELINES" unary --connections 1 "${KNOBS[@]}") ;;
            raw-unary-4) command=("$BASELINES" unary --connections 4 "${KNOBS[@]}") ;;
            grpc-stream) command=("$SWITCHYARD" bench --transport grpc --via stream "${KNOBS[@]}") ;;
            quic-stream) command=("$SWITCHYARD" bench --transport quic --via stream "${KNOBS[@]}") ;;
            grpc-unary-1) command=("$SWITCHYARD" bench --transport grpc --via unary
                                   --connections 1 "${KNOBS[@]}") ;;
            grpc-unary-4) command=("$SWITCHYARD" bench --transport grpc --via unary
                                   --connections 4 "${KNOBS[@]}") ;;
        esac
        echo "round $round: ${command[*]}" >&2
        timeout "$RUN_TIMEOUT" "${command[@]}" >"$RESULTS/$config-$round.json"
    done
done

python3 - "$RESULTS" "$ROUNDS" "${CONFIGS[@]}" <<'PY' | tee "$RESULTS/summary.md"
import json, statistics, sys

results, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
reports = {}
for config in configs:
    reports[config] = []
    for n in range(1, rounds + 1):
        with open(f"{results}/{config}-{n}.json") as f:
            reports[config].append(json.load(f))

def cell(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "n/a"
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"

def figures(config, field):
    return [r.get(field) for r in reports[config]]

print("| configuration | tasks/s | p50 µs | p99 µs | machine CPU µs/task | load 1m |")
print("| --- | --- | --- | --- | --- | --- |")
for config in configs:
    print(f"| {config} | {cell(figures(config, 'tasks_per_sec'), lambda v: f'{v:,.0f}')} "
          f"| {cell(figures(config, 'p50_us'), lambda v: f'{v:,.0f}')} "
          f"| {cell(figures(config, 'p99_us'), lambda v: f'{v:,.0f}')} "
          f"| {cell(figures(config, 'cpu_us_per_dispatch'), lambda v: f'{v:.1f}')} "
          f"| {cell(figures(config, 'load_average_1m'), lambda v: f'{v:.1f}')} |")

def ratio(numerator, field_n, denominator, field_d):
    """Per-round ratio (same round, so the same drift), median and min-max."""
    values = []
    for a, b in zip(reports[numerator], reports[denominator]):
        if a.get(field_n) and b.get(field_d):
            values.append(a[field_n] / b[field_d])
    return cell(values, lambda v: f"{v:.2f}×")

print()
print("| ratio (per round) | median (min–max) |")
print("| --- | --- |")
for label, n, fn, d, fd in [
    ("gRPC via stream ÷ NATS, throughput", "grpc-stream", "tasks_per_sec", "nats", "tasks_per_sec"),
    ("QUIC via stream ÷ NATS, throughput", "quic-stream", "tasks_per_sec", "nats", "tasks_per_sec"),
    ("gRPC via stream ÷ relay, CPU per task", "grpc-stream", "cpu_us_per_dispatch", "relay", "cpu_us_per_dispatch"),
    ("QUIC via stream ÷ relay, CPU per task", "quic-stream", "cpu_us_per_dispatch", "relay", "cpu_us_per_dispatch"),
    ("unary Dispatch ÷ raw unary, 1 connection", "grpc-unary-1", "tasks_per_sec", "raw-unary-1", "tasks_per_sec"),
    ("unary Dispatch ÷ raw unary, 4 connections", "grpc-unary-4", "tasks_per_sec", "raw-unary-4", "tasks_per_sec"),
    ("unary Dispatch, 4 connections ÷ 1", "grpc-unary-4", "tasks_per_sec", "grpc-unary-1", "tasks_per_sec"),
    ("raw unary, 4 connections ÷ 1", "raw-unary-4", "tasks_per_sec", "raw-unary-1", "tasks_per_sec"),
]:
    print(f"| {label} | {ratio(n, fn, d, fd)} |")
PY
