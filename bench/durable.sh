#!/usr/bin/env bash
# Durable dispatch beside NATS JetStream, for docs/benchmarks.md.
#
# Starts nats-server with JetStream on file storage in a temporary directory (it must be
# installed: `apt-get install -y nats-server`; this script installs nothing), then runs, ROUNDS
# times and interleaved so drift on a shared machine hits every configuration alike:
#   - the JetStream baseline (bench/jetstream: work-queue stream, file storage, one replica;
#     publish with ack -> pull consume -> ack -> reply),
#   - `switchyard bench --durable --via stream` (DispatchStream, durable per request),
#   - `switchyard bench --durable --via submit` (Submit + WatchOutcomes),
#   - `switchyard bench --durable --via stream --store sqlite-normal` and `--store memory`
#     (where the durable path's time goes: the fsync, the file, or neither),
#   - `switchyard bench --via stream` (ephemeral, the same knobs, for reference),
# and prints one Markdown row per configuration: the median of each figure with its min-max.
# Every run's JSON goes to $RESULTS/durable-<config>-<round>.json.
#
# Knobs (environment): WORKERS (4), CAPACITY (64), OUTSTANDING (256), TASKS (100000),
# PAYLOAD (64), SERVICE_TIME_US (0), ROUNDS (3), NATS_PORT (14222), RESULTS (where the JSON
# goes; bench/results), CONFIGS (a space-separated subset of the configurations below; all).
# Binaries: $BIN (default $CARGO_TARGET_DIR/release, or target/release) must hold `switchyard` and
# `switchyard-jetstream-baseline`:
#   cargo build --release --locked -p switchyard
#   (cd bench/jetstream && CARGO_TARGET_DIR=../../target cargo build --release --locked)
# Bounded: every run has a 600 s timeout; nats-server is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
SWITCHYARD=$BIN/switchyard
BASELINE=$BIN/switchyard-jetstream-baseline
WORKERS=${WORKERS:-4}
CAPACITY=${CAPACITY:-64}
OUTSTANDING=${OUTSTANDING:-256}
TASKS=${TASKS:-100000}
PAYLOAD=${PAYLOAD:-64}
SERVICE_TIME_US=${SERVICE_TIME_US:-0}
ROUNDS=${ROUNDS:-3}
NATS_PORT=${NATS_PORT:-14222}
RESULTS=${RESULTS:-$ROOT/bench/results}

. "$ROOT/bench/lib/nats.sh"
bench_preflight "$SWITCHYARD" "$BASELINE"
start_nats jetstream

KNOBS=(--workers "$WORKERS" --capacity "$CAPACITY" --outstanding "$OUTSTANDING"
       --tasks "$TASKS" --payload "$PAYLOAD" --service-time-us "$SERVICE_TIME_US")
mkdir -p "$RESULTS"
read -r -a CONFIGS <<<"${CONFIGS:-jetstream durable-stream durable-submit durable-stream-normal durable-stream-memory ephemeral-stream}"
for round in $(seq "$ROUNDS"); do
    for config in "${CONFIGS[@]}"; do
        case $config in
            jetstream) command=("$BASELINE" --server "127.0.0.1:$NATS_PORT" "${KNOBS[@]}") ;;
            durable-stream) command=("$SWITCHYARD" bench --durable --via stream "${KNOBS[@]}") ;;
            durable-submit) command=("$SWITCHYARD" bench --durable --via submit "${KNOBS[@]}") ;;
            durable-stream-normal) command=("$SWITCHYARD" bench --durable --via stream
                                            --store sqlite-normal "${KNOBS[@]}") ;;
            durable-stream-memory) command=("$SWITCHYARD" bench --durable --via stream
                                            --store memory "${KNOBS[@]}") ;;
            ephemeral-stream) command=("$SWITCHYARD" bench --via stream "${KNOBS[@]}") ;;
            *) echo "unknown configuration $config" >&2; exit 1 ;;
        esac
        echo "round $round: ${command[*]}" >&2
        timeout 600 "${command[@]}" >"$RESULTS/durable-$config-$round.json"
    done
done

python3 - "$RESULTS" "$ROUNDS" "${CONFIGS[@]}" <<'PY'
import json, statistics, sys

results, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def cell(values, fmt):
    values = sorted(v for v in values if v is not None)
    if not values:
        return "n/a"
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"

print("| configuration | dispatches/s | p50 µs | p99 µs | CPU µs/dispatch | load 1m | duplicates |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for config in configs:
    reports = []
    for n in range(1, rounds + 1):
        with open(f"{results}/durable-{config}-{n}.json") as f:
            reports.append(json.load(f))
    duplicates = [r.get("duplicate_executions", r.get("executions", 0) - r["parameters"]["tasks"]) for r in reports]
    print(f"| {config} | {cell([r['tasks_per_sec'] for r in reports], lambda v: f'{v:,.0f}')} "
          f"| {cell([r['p50_us'] for r in reports], lambda v: f'{v:,.0f}')} "
          f"| {cell([r['p99_us'] for r in reports], lambda v: f'{v:,.0f}')} "
          f"| {cell([r['cpu_us_per_dispatch'] for r in reports], lambda v: f'{v:.1f}')} "
          f"| {cell([r['load_average_1m'] for r in reports], lambda v: f'{v:.1f}')} "
          f"| {sum(duplicates)} |")
PY
