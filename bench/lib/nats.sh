# Shared by bench/baselines.sh, bench/cluster.sh and bench/durable.sh (sourced, not run): the
# checks every one of them makes before its first run, and the nats-server each one starts on
# loopback and stops on exit. Installs nothing.

# Exits with a message naming what to do when nats-server, one of the binaries given, or a
# sane ROUNDS (1..20) is missing.
bench_preflight() {
    if ! command -v nats-server >/dev/null; then
        echo "nats-server is not installed (Debian: apt-get install -y nats-server)" >&2
        exit 1
    fi
    local binary
    for binary in "$@"; do
        if [[ ! -x $binary ]]; then
            echo "$binary is missing; build it first (see the top of $0)" >&2
            exit 1
        fi
    done
    if (( ROUNDS < 1 || ROUNDS > 20 )); then
        echo "ROUNDS must be 1..20" >&2
        exit 1
    fi
}

# Makes SCRATCH (a temporary directory removed on exit) and starts nats-server on
# 127.0.0.1:$NATS_PORT, stopped on exit; with the argument `jetstream`, with JetStream on file
# storage in $SCRATCH/jetstream. Waits (bounded: 10 s) for it to be ready, or exits with its log.
start_nats() {
    SCRATCH=$(mktemp -d)
    NATS_PID=
    trap stop_nats EXIT
    local jetstream=()
    if [[ ${1:-} == jetstream ]]; then
        jetstream=(-js -sd "$SCRATCH/jetstream")
    fi
    nats-server "${jetstream[@]}" -a 127.0.0.1 -p "$NATS_PORT" >"$SCRATCH/nats.log" 2>&1 &
    NATS_PID=$!
    for _ in $(seq 100); do
        if grep -q "Server is ready" "$SCRATCH/nats.log"; then
            break
        fi
        sleep 0.1
    done
    if ! grep -q "Server is ready" "$SCRATCH/nats.log"; then
        echo "nats-server did not start:" >&2
        cat "$SCRATCH/nats.log" >&2
        exit 1
    fi
    echo "nats-server $(nats-server --version | awk '{print $2}') on 127.0.0.1:$NATS_PORT" \
        "${jetstream[@]:+(JetStream store in $SCRATCH/jetstream)}" >&2
}

# Stops the nats-server start_nats started and removes SCRATCH (the EXIT trap).
stop_nats() {
    if [[ -n ${NATS_PID:-} ]]; then
        kill "$NATS_PID" 2>/dev/null || true
        wait "$NATS_PID" 2>/dev/null || true
    fi
    rm -rf "${SCRATCH:-}"
}
