#!/usr/bin/env bash
# Constrained-link figures: the gateway (and the producer) in one network namespace, the workers
# in another, joined by `linkem` for each link profile. Reports p50/p99 dispatch latency,
# throughput, duplicate executions (counted inside the workers' handlers) and the bytes on the
# wire per dispatch, for gRPC workers and for QUIC workers with the QUIC congestion controller of
# both ends (the gateway's and the workers') set to Cubic and to BBR, with QUIC redundancy off
# and/or `datagram`.
#
# Each run gets a fresh link (linkem) and gateway, so the wire bytes are the run's own and a
# blackout schedule starts at the same point of every run.
#
# Needs root and /dev/net/tun. Uses only private addresses inside two namespaces it creates
# (linkem creates and deletes them); everything it started is stopped on exit.
#
# Usage: bench/constrained.sh [PROFILE...]   (default: lan wan lossy cellular-bad)
# Profiles: lan wan lossy cellular-bad, blip (cellular-bad plus a 3 s blackout, both ways,
# every 20 s from 10 s after the link is up), and outage (cellular-bad plus one 40 s blackout
# from 10 s after the link is up: long enough for both ends to give the connection up).
# Environment: TASKS_lan, TASKS_wan, TASKS_lossy, TASKS_cellular_bad, TASKS_blip (dispatches per
# run), OUTSTANDING (default 64), WORKERS (default 4), CAPACITY (default 64), PAYLOAD (default
# 64), CCS (QUIC congestion controllers, default "cubic bbr"), REDUNDANCY (QUIC redundancy
# settings, default "off"; "off datagram" runs both), GRACE (reconnect grace for both
# transports, e.g. "0s" or "60s"; unset keeps the gateway's defaults), RUNS (default 1),
# LINKEM_EXTRA (extra linkem flags for every run, e.g. "--loss 0%"), QUIC_LINKS (QUIC send
# scheduling and ACK frequency of both ends, default "default"; "default tuned" runs both in each
# round: "tuned" is `quic.send_fairness = false` and `quic.ack_eliciting_threshold = 8` on the
# gateway and the same on the workers), NO_BUILD=1 to use the existing release binaries.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
profiles=("$@")
[ ${#profiles[@]} -gt 0 ] || profiles=(lan wan lossy cellular-bad)

NS_GW="sy-gw-$$"
NS_WK="sy-wk-$$"
GW_ADDR=10.77.0.1
TOKEN="bench-token-$$-$RANDOM"
OUTSTANDING=${OUTSTANDING:-64}
WORKERS=${WORKERS:-4}
CAPACITY=${CAPACITY:-64}
PAYLOAD=${PAYLOAD:-64}
CCS=${CCS:-cubic bbr}
REDUNDANCY=${REDUNDANCY:-off}
QUIC_LINKS=${QUIC_LINKS:-default}
RUNS=${RUNS:-1}
export GRACE=${GRACE:-}
# Each run is also bounded by the bench's own deadlines and by `timeout` below.
RUN_TIMEOUT=240

if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/net/tun ]; then
    echo "constrained.sh: needs root and /dev/net/tun" >&2
    exit 2
fi

if [ -z "${NO_BUILD:-}" ]; then
    cargo build --release -p switchyard -p switchyard-linkem >&2
fi
switchyard="$root/target/release/switchyard"
linkem="$root/target/release/linkem"

work=$(mktemp -d /tmp/switchyard-constrained.XXXXXX)
linkem_pid=""
gateway_pid=""
workers_pid=""

stop() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop "$workers_pid"
    stop "$gateway_pid"
    stop "$linkem_pid"
    "$linkem" cleanup --ns-a "$NS_GW" --ns-b "$NS_WK" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tasks_for() {
    local var="TASKS_${1//-/_}"
    local default
    case "$1" in
        lan) default=20000 ;;
        wan) default=5000 ;;
        lossy) default=2000 ;;
        blip) default=6000 ;;
        outage) default=4000 ;;
        *) default=500 ;;
    esac
    echo "${!var:-$default}"
}

timeout_for() { # the producer's deadline per dispatch, in seconds: past the profile's blackout
    case "$1" in
        outage) echo 120 ;;
        *) echo 30 ;;
    esac
}

wait_for() { # DESCRIPTION COMMAND...: retries for up to 30 s
    local what=$1
    shift
    for _ in $(seq 1 300); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "constrained.sh: timed out waiting for $what" >&2
    return 1
}

linkem_args() { # PROFILE
    case "$1" in
        blip) echo --profile cellular-bad --blackout-at 10s --blackout-for 3s --blackout-every 20s ;;
        outage) echo --profile cellular-bad --blackout-at 10s --blackout-for 40s ;;
        *) echo --profile "$1" ;;
    esac
    # Extra linkem flags for every run (e.g. LINKEM_EXTRA="--loss 0%" to split a tail into
    # what loss causes and what it does not).
    echo "${LINKEM_EXTRA:-}"
}

start_link() { # PROFILE
    # shellcheck disable=SC2046
    "$linkem" $(linkem_args "$1") --ns-a "$NS_GW" --ns-b "$NS_WK" --duration 1800s \
        >"$work/linkem.jsonl" 2>"$work/linkem.log" &
    linkem_pid=$!
    wait_for "linkem" grep -q '"ready"' "$work/linkem.jsonl"
    # The gateway binds this address: seen missing for a moment after "ready" (bind failed
    # with EADDRNOTAVAIL), so wait until the namespace has it.
    wait_for "the gateway's address" bash -c \
        "ip netns exec '$NS_GW' ip -4 -o addr show | grep -q ' $GW_ADDR/'"
}

link_bytes() { # the bytes both ways the stopped link delivered over its run
    python3 - "$work/linkem.jsonl" <<'PY'
import json, sys
stopped = [json.loads(l) for l in open(sys.argv[1]) if '"stopped"' in l]
if stopped:
    s = stopped[-1]
    print(s["a_to_b"]["delivered_bytes"] + s["b_to_a"]["delivered_bytes"])
else:
    print(0)
PY
}

link_flags() { # QUIC_LINK: the bench workers' flags for it
    case "$1" in
        tuned) echo --quic-send-fairness false --quic-ack-threshold 8 ;;
        *) echo --quic-send-fairness true --quic-ack-threshold 0 ;;
    esac
}

start_gateway() { # CONGESTION REDUNDANCY QUIC_LINK
    local data="$work/gw"
    mkdir -p "$data"
    local grace=()
    if [ -n "$GRACE" ]; then
        grace=(SWITCHYARD_GRPC_RECONNECT_GRACE="$GRACE" SWITCHYARD_QUIC_RECONNECT_GRACE="$GRACE")
    fi
    local link=(SWITCHYARD_QUIC_SEND_FAIRNESS=true SWITCHYARD_QUIC_ACK_ELICITING_THRESHOLD=0)
    if [ "$3" = tuned ]; then
        link=(SWITCHYARD_QUIC_SEND_FAIRNESS=false SWITCHYARD_QUIC_ACK_ELICITING_THRESHOLD=8)
    fi
    ip netns exec "$NS_GW" env "${grace[@]}" "${link[@]}" \
        SWITCHYARD_QUIC_CONGESTION="$1" \
        SWITCHYARD_QUIC_REDUNDANCY="$2" \
        SWITCHYARD_PRINCIPALS="[{ name = \"bench\", token = \"$TOKEN\", namespaces = [\"bench\"] }]" \
        "$switchyard" serve --grpc-listen "$GW_ADDR:7700" --quic-listen "$GW_ADDR:7701" \
        --ops-listen 127.0.0.1:7702 --data-dir "$data" --log-filter error \
        >"$work/gateway.log" 2>&1 &
    gateway_pid=$!
    if ! wait_for "the gateway" ip netns exec "$NS_GW" bash -c "exec 3<>/dev/tcp/$GW_ADDR/7700"; then
        tail -n 5 "$work/gateway.log" >&2
        return 1
    fi
    wait_for "the CA" test -s "$data/tls/ca.pem"
}

bench_args() {
    echo --connect "$GW_ADDR:7700" --ca "$work/gw/tls/ca.pem" --token "$TOKEN" \
        --workers "$WORKERS" --capacity "$CAPACITY"
}

run_one() { # PROFILE TRANSPORT CONGESTION REDUNDANCY QUIC_LINK
    local profile=$1 transport=$2 cc=$3 redundancy=$4 quic_link=$5 tasks bytes
    tasks=$(tasks_for "$profile")
    start_link "$profile"
    if ! start_gateway "$cc" "$redundancy" "$quic_link"; then
        echo "| $profile | $transport/$cc/$redundancy | failed: the gateway did not start | | | | | | |"
        stop "$gateway_pid"
        gateway_pid=""
        stop "$linkem_pid"
        linkem_pid=""
        return 0
    fi
    # shellcheck disable=SC2046
    ip netns exec "$NS_WK" "$switchyard" bench $(bench_args) --transport "$transport" \
        --redundancy "$redundancy" --congestion "$cc" $(link_flags "$quic_link") \
        --workers-only "$RUN_TIMEOUT" >"$work/workers.json" 2>"$work/workers.log" &
    workers_pid=$!
    local out="$work/result-$profile-$transport-$cc-$redundancy.json"
    # shellcheck disable=SC2046
    if ! timeout "$RUN_TIMEOUT" ip netns exec "$NS_GW" "$switchyard" bench $(bench_args) \
        --external-workers --transport "$transport" --tasks "$tasks" \
        --outstanding "$OUTSTANDING" --payload "$PAYLOAD" \
        --dispatch-timeout-secs "$(timeout_for "$profile")" >"$out" 2>"$work/producer.log"; then
        echo "constrained.sh: $profile/$transport/$cc failed: $(tail -n 3 "$work/producer.log")" >&2
        echo '{}' >"$out"
    fi
    stop "$workers_pid"
    workers_pid=""
    if [ "$redundancy" != off ] && [ "$transport" = quic ]; then
        # The gateway's side of the copies (task copies sent, result copies used or dropped).
        ip netns exec "$NS_GW" python3 - "$profile" "$cc" <<'PY' >&2 || true
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:7702/metrics", timeout=5).read().decode()
counts = {}
for line in text.splitlines():
    if line.startswith("switchyard_quic_datagram_copies_total{"):
        event = line.split('event="', 1)[1].split('"', 1)[0]
        counts[event] = int(float(line.rsplit(" ", 1)[1]))
print(f"{sys.argv[1]} quic/{sys.argv[2]}: gateway datagram copies "
      f"sent/used/dropped/lane-dropped = "
      f"{[counts.get(e, 0) for e in ('sent', 'used', 'dropped', 'lane_copy_dropped')]}")
PY
    fi
    stop "$gateway_pid"
    gateway_pid=""
    stop "$linkem_pid"
    linkem_pid=""
    bytes=$(link_bytes)
    python3 - "$profile" "$transport" "$cc" "$redundancy" "$out" "$work/workers.json" \
        "$bytes" "$quic_link" <<'PY'
import json, os, sys
profile, transport, cc, redundancy, path, workers_path, wire, quic_link = sys.argv[1:]
r = json.load(open(path))
try:
    w = json.load(open(workers_path))
    dup = str(w.get("duplicate_executions", ""))
    copies = w.get("datagram_copies")
    if copies and copies[0]:
        print(f"{profile} {transport}/{cc}/{redundancy}: worker datagram copies "
              f"sent/used/dropped/lane-dropped = {copies}", file=sys.stderr)
except (OSError, ValueError):
    dup = "?"
label = transport if transport == "grpc" else f"quic/{cc}/{redundancy}"
if transport == "quic" and quic_link != "default":
    label += f" ({quic_link})"
grace = os.environ.get("GRACE")
if grace:
    label += f" (grace {grace})"
if not r:
    print(f"| {profile} | {label} | failed | | | | | {dup} | |")
else:
    done = r["outcomes"].get("completed", 0)
    total = sum(r["outcomes"].values())
    per = int(wire) / total if total else 0
    print(f"| {profile} | {label} | {r['tasks_per_sec']:.0f} | {r['p50_us']/1000:.1f} | "
          f"{r['p99_us']/1000:.1f} | {r['max_us']/1000:.1f} | {done}/{total} | {dup} | {per:.0f} |")
PY
}

echo "| profile | workers over | dispatches/s | p50 ms | p99 ms | max ms | completed | duplicate executions | wire bytes/dispatch |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for profile in "${profiles[@]}"; do
    for _ in $(seq 1 "$RUNS"); do
        # TCP is unaffected by the gateway's QUIC settings: run gRPC once per round.
        run_one "$profile" grpc cubic off default
        for cc in $CCS; do
            for redundancy in $REDUNDANCY; do
                for quic_link in $QUIC_LINKS; do
                    run_one "$profile" quic "$cc" "$redundancy" "$quic_link"
                done
            done
        done
    done
done
