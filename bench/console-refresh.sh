#!/usr/bin/env bash
# What the console's refresh costs the gateway: `switchyard serve` with 1,000 idle workers
# (500 gRPC + 500 QUIC, from two `switchyard bench --workers-only` processes), its CPU time
# (utime + stime from /proc/PID/stat) over WINDOW seconds with no browser, then with one
# headless Chromium showing the console (driven over chromedriver's WebDriver HTTP API), ROUNDS
# times alternating. Prints one line per window and the difference in percent of one core.
#
# Needs target/release/switchyard, chromium and chromium-driver, curl. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

B=${B:-target/release/switchyard}
WORKERS=${WORKERS:-1000}
WINDOW=${WINDOW:-60}
ROUNDS=${ROUNDS:-2}
BASE=${BASE:-17900}
GRPC=127.0.0.1:$BASE QUIC=127.0.0.1:$((BASE + 1)) OPS=127.0.0.1:$((BASE + 2))
DRIVER_PORT=$((BASE + 3))
DIR=$(mktemp -d /tmp/sy-console.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

ulimit -n 8192
export SWITCHYARD_GRPC_MAX_CONNECTIONS_PER_ADDRESS=$((WORKERS + 64))
export SWITCHYARD_QUIC_MAX_CONNECTIONS_PER_ADDRESS=$((WORKERS + 64))
"$B" serve --data-dir "$DIR" --grpc-listen "$GRPC" --quic-listen "$QUIC" --ops-listen "$OPS" \
    --log-filter warn >"$DIR/serve.log" 2>&1 &
GATEWAY=$!
PIDS+=("$GATEWAY")
for _ in $(seq 100); do curl -sf "http://$OPS/readyz" >/dev/null && break; sleep 0.2; done

half=$((WORKERS / 2))
for transport in grpc quic; do
    "$B" bench --connect "$GRPC" --quic-connect "$QUIC" --ca "$DIR/tls/ca.pem" \
        --transport "$transport" --workers "$half" --capacity 4 \
        --workers-only 3600 >"$DIR/workers-$transport.log" 2>&1 &
    PIDS+=("$!")
done
for _ in $(seq 600); do
    n=$(curl -sf "http://$OPS/v1/workers?limit=1&standing=eligible" | sed -E 's/.*"total":([0-9]+).*/\1/')
    [ "${n:-0}" -ge "$WORKERS" ] && break
    sleep 0.5
done
echo "workers eligible: $n"

# Gateway CPU seconds (user + system) so far.
cpu() { awk '{ print ($14 + $15) / 100 }' "/proc/$GATEWAY/stat"; }
measure() {
    local before after
    before=$(cpu)
    sleep "$WINDOW"
    after=$(cpu)
    awk -v a="$after" -v b="$before" -v w="$WINDOW" 'BEGIN { printf "%.3f", (a - b) / w * 100 }'
}

/usr/bin/chromedriver --port="$DRIVER_PORT" >"$DIR/chromedriver.log" 2>&1 &
PIDS+=("$!")
DRIVER=http://127.0.0.1:$DRIVER_PORT
for _ in $(seq 100); do curl -sf "$DRIVER/status" >/dev/null && break; sleep 0.2; done

open_page() {
    local session
    session=$(curl -sf -X POST "$DRIVER/session" -H 'content-type: application/json' -d '{
      "capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
        "binary": "/usr/bin/chromium",
        "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1440,1300", "--user-data-dir='"$DIR/profile-$RANDOM"'"]}}}}' |
        sed -E 's/.*"sessionId":"([^"]+)".*/\1/')
    curl -sf -X POST "$DRIVER/session/$session/url" -H 'content-type: application/json' \
        -d "{\"url\": \"http://$OPS/\"}" >/dev/null
    echo "$session"
}
page_refreshed() {
    curl -sf -X POST "$DRIVER/session/$1/execute/sync" -H 'content-type: application/json' \
        -d '{"script": "return document.getElementById(\"refreshed\").textContent + \" · \" + document.getElementById(\"workers-count\").textContent;", "args": []}'
}
close_page() { curl -sf -X DELETE "$DRIVER/session/$1" >/dev/null || true; }

for round in $(seq "$ROUNDS"); do
    idle=$(measure)
    echo "round $round: no browser:  ${idle} % of a core"
    session=$(open_page)
    sleep 5
    with=$(measure)
    echo "round $round: one browser: ${with} % of a core  (page: $(page_refreshed "$session"))"
    close_page "$session"
    awk -v a="$with" -v b="$idle" 'BEGIN { printf "round %d: refresh cost %.3f %% of a core\n", '"$round"', a - b }'
done

# The same cost, less exposed to the idle gateway's own noise: BURST refreshes of the page's
# requests back to back over one keep-alive connection (pools, unserved, a page of 50 workers,
# and the history, which the page asks every 5 s rather than every 2 s, so 2 in 5 of them),
# less the idle rate over the same time, per refresh.
BURST=${BURST:-300}
urls=()
for i in $(seq "$BURST"); do
    urls+=("http://$OPS/v1/pools" "http://$OPS/v1/unserved" "http://$OPS/v1/workers?offset=0&limit=50")
    [ $((i % 5)) -lt 2 ] && urls+=("http://$OPS/v1/history")
done
idle=$(measure)
before=$(cpu)
start=$(date +%s.%N)
curl -sf "${urls[@]}" >/dev/null
end=$(date +%s.%N)
after=$(cpu)
awk -v a="$after" -v b="$before" -v s="$start" -v e="$end" -v idle="$idle" -v n="$BURST" 'BEGIN {
    wall = e - s; busy = (a - b) - idle / 100 * wall
    per = busy / n * 1000
    printf "burst: %d refreshes in %.2f s, gateway CPU %.2f s (idle rate %.3f %% removed): %.3f ms per refresh = %.3f %% of a core at one refresh every 2 s\n", n, wall, a - b, idle, per, per / 2000 * 100
}'
