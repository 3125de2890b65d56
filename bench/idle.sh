#!/usr/bin/env bash
# What idle workers cost one gateway process, per transport: `switchyard serve` alone, then
# GRPC idle gRPC workers (one `switchyard bench --workers-only` process), then QUIC idle QUIC
# workers (a second one); the gateway's VmRSS (/proc/PID/status) before and once each group is
# eligible (counted through the ops API), and the time from the first connect to all eligible.
# Then, with all of them still connected, PROBES dispatches one at a time to those workers from
# a third process (`--external-workers`), whose JSON report gives the dispatch p99.
#
# Needs the release binary (B; WB for the workers and the probe, default B), curl. Loopback
# only; the gateway and the workers are separate processes, so the RSS is the gateway's own.
# Stops early if a worker process ends (its last line says why). Prints one JSON object.
#
# With all connected and before the probes it also measures what idleness costs: the CPU time
# (utime + stime, /proc/PID/stat) of the gateway and of the worker processes over CPU_WINDOW
# seconds (default 30; 0 skips it), and, when HOLD is a list of seconds ("30 180"), the
# gateway's RSS that long after all were eligible. PERF_OUT=file records the gateway with
# `perf record -F 499 -g` for PERF_SECONDS (default 10) after the CPU window.
set -euo pipefail
cd "$(dirname "$0")/.."

B=${B:-target/release/switchyard}
# The binary of the worker and probe processes (default: B), so that gateways of two builds can
# be compared with the same workers.
WB=${WB:-$B}
GRPC=${GRPC:-5000}
QUIC=${QUIC:-5000}
PROBES=${PROBES:-2000}
BASE=${BASE:-18900}
CPU_WINDOW=${CPU_WINDOW:-30}
HOLD=${HOLD:-}
PERF_OUT=${PERF_OUT:-}
PERF_SECONDS=${PERF_SECONDS:-10}
GRPC_ADDR=127.0.0.1:$BASE QUIC_ADDR=127.0.0.1:$((BASE + 1)) OPS=127.0.0.1:$((BASE + 2))
DIR=$(mktemp -d /tmp/sy-idle.XXXXXX)
PIDS=()
declare -A WORKERS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

ulimit -n "$(ulimit -Hn)"
TOTAL=$((GRPC + QUIC))
export SWITCHYARD_GRPC_MAX_CONNECTIONS=$((TOTAL + 1024))
export SWITCHYARD_GRPC_MAX_CONNECTIONS_PER_ADDRESS=$((TOTAL + 64))
export SWITCHYARD_QUIC_MAX_CONNECTIONS_PER_ADDRESS=$((TOTAL + 64))
"$B" serve --data-dir "$DIR" --grpc-listen "$GRPC_ADDR" --quic-listen "$QUIC_ADDR" \
    --ops-listen "$OPS" --log-filter warn >"$DIR/serve.log" 2>&1 &
GATEWAY=$!
PIDS+=("$GATEWAY")
for _ in $(seq 100); do curl -sf "http://$OPS/readyz" >/dev/null && break; sleep 0.2; done
sleep 2

rss() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$GATEWAY/status"; }
eligible() {
    curl -sf "http://$OPS/v1/workers?limit=1&standing=eligible" |
        sed -E 's/.*"total":([0-9]+).*/\1/'
}
# Waits (bounded: 600 s) until $1 workers are eligible; gives up at once if a worker process
# ended (its log says why).
wait_eligible() {
    local n=0
    for _ in $(seq 1200); do
        n=$(eligible || echo 0)
        [ "${n:-0}" -ge "$1" ] && return 0
        for log in "${!WORKERS[@]}"; do
            if ! kill -0 "${WORKERS[$log]}" 2>/dev/null; then
                echo "a worker process ended with $n of $1 eligible: $(tail -1 "$log")" >&2
                return 1
            fi
        done
        sleep 0.5
    done
    echo "only $n of $1 workers eligible after 600 s" >&2
    return 1
}
now() { date +%s.%N; }

rss_before=$(rss)
started=$(now)
connect() {
    "$WB" bench --connect "$GRPC_ADDR" --quic-connect "$QUIC_ADDR" --ca "$DIR/tls/ca.pem" \
        --transport "$1" --workers "$2" --capacity 1 \
        --workers-only 3600 >"$DIR/workers-$1.log" 2>&1 &
    PIDS+=("$!")
    WORKERS["$DIR/workers-$1.log"]=$!
}
[ "$GRPC" -gt 0 ] && connect grpc "$GRPC"
wait_eligible "$GRPC"
grpc_at=$(now)
sleep 2
rss_grpc=$(rss)
[ "$QUIC" -gt 0 ] && connect quic "$QUIC"
wait_eligible "$TOTAL"
quic_at=$(now)
sleep 2
rss_all=$(rss)
load_connected=$(cut -d' ' -f1 /proc/loadavg)

# CPU ticks (utime + stime) of the processes given; a process that ended counts 0.
ticks() {
    local sum=0 t
    for pid in "$@"; do
        t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat" 2>/dev/null || echo 0)
        sum=$((sum + t))
    done
    echo "$sum"
}
# InDatagrams of /proc/net/snmp's Udp line.
udp_in() { awk '/^Udp: [0-9]/ { print $2; exit }' /proc/net/snmp; }
hz=$(getconf CLK_TCK)
gateway_cpu=0 workers_cpu=0 udp_rate=0
if [ "$CPU_WINDOW" -gt 0 ]; then
    g0=$(ticks "$GATEWAY") w0=$(ticks "${WORKERS[@]}") u0=$(udp_in) c0=$(now)
    sleep "$CPU_WINDOW"
    g1=$(ticks "$GATEWAY") w1=$(ticks "${WORKERS[@]}") u1=$(udp_in) c1=$(now)
    # Every UDP datagram received on this machine (on loopback, each one sent by either side;
    # other processes' UDP counts too, so read it on a quiet machine).
    udp_rate=$(awk -v a="$u0" -v b="$u1" -v s="$c0" -v e="$c1" 'BEGIN { printf "%.0f", (b - a) / (e - s) }')
    # CPU milliseconds per wall second (1000 = one core busy).
    gateway_cpu=$(awk -v a="$g0" -v b="$g1" -v s="$c0" -v e="$c1" -v hz="$hz" \
        'BEGIN { printf "%.1f", (b - a) * 1000 / hz / (e - s) }')
    workers_cpu=$(awk -v a="$w0" -v b="$w1" -v s="$c0" -v e="$c1" -v hz="$hz" \
        'BEGIN { printf "%.1f", (b - a) * 1000 / hz / (e - s) }')
fi
load_idle=$(cut -d' ' -f1 /proc/loadavg)
if [ -n "$PERF_OUT" ]; then
    perf record -F 499 -g -p "$GATEWAY" -o "$PERF_OUT" -- sleep "$PERF_SECONDS" \
        >/dev/null 2>&1 || echo "perf record failed" >&2
fi
held="{"
for at in $HOLD; do
    wait_s=$(awk -v at="$at" -v q="$quic_at" -v n="$(now)" 'BEGIN { d = q + at - n; print (d > 0 ? d : 0) }')
    sleep "$wait_s"
    [ "$held" = "{" ] || held="$held,"
    held="$held\"$at\":$(rss)"
done
held="$held}"

probe=$("$WB" bench --connect "$GRPC_ADDR" --quic-connect "$QUIC_ADDR" --ca "$DIR/tls/ca.pem" \
    --external-workers --workers "$TOTAL" --tasks "$PROBES" --outstanding 1 --via stream)
rss_end=$(rss)
peak=$(awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$GATEWAY/status")

awk -v g="$GRPC" -v q="$QUIC" -v b="$rss_before" -v rg="$rss_grpc" -v ra="$rss_all" \
    -v re="$rss_end" -v pk="$peak" -v s="$started" -v tg="$grpc_at" -v tq="$quic_at" \
    -v load="$load_connected" -v probe="$probe" -v gcpu="$gateway_cpu" -v wcpu="$workers_cpu" \
    -v cw="$CPU_WINDOW" -v li="$load_idle" -v held="$held" -v udp="$udp_rate" 'BEGIN {
    printf "{\"grpc_workers\":%.0f,\"quic_workers\":%.0f,\"rss_before_bytes\":%.0f,", g, q, b
    printf "\"rss_grpc_connected_bytes\":%.0f,\"rss_all_connected_bytes\":%.0f,", rg, ra
    printf "\"rss_after_probes_bytes\":%.0f,\"peak_rss_bytes\":%.0f,", re, pk
    printf "\"rss_per_grpc_worker_bytes\":%.0f,", g ? (rg - b) / g : 0
    printf "\"rss_per_quic_worker_bytes\":%.0f,", q ? (ra - rg) / q : 0
    printf "\"rss_per_worker_bytes\":%.0f,", (ra - b) / (g + q)
    printf "\"grpc_connect_to_eligible_s\":%.1f,\"quic_connect_to_eligible_s\":%.1f,", tg - s, tq - tg - 2
    printf "\"cpu_window_s\":%s,\"gateway_cpu_ms_per_s\":%s,\"workers_cpu_ms_per_s\":%s,", cw, gcpu, wcpu
    printf "\"udp_datagrams_per_s\":%s,\"load_average_1m_after_window\":%s,", udp, li
    printf "\"rss_bytes_after_eligible_s\":%s,", held
    printf "\"load_average_1m_connected\":%s,\"probe\":%s}\n", load, probe
}'
