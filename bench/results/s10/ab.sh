#!/usr/bin/env bash
# Interleaved before/after rounds of bench/durable.sh (ROUNDS=1 per build per round), with
# `uptime` before each; usage: ab.sh OUTDIR ROUNDS TASKS CONFIGS...
# Builds in $ROOT/reltarget/{before,after} (each holding `switchyard` and
# `switchyard-jetstream-baseline`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
OUT=$1; N=$2; T=$3; shift 3
mkdir -p "$OUT"
for r in $(seq "${FIRST:-1}" "$N"); do
  for which in before after; do
    uptime > "$OUT/$which-$r.load"
    RESULTS="$OUT/$which-$r" BIN=reltarget/$which ROUNDS=1 TASKS=$T CONFIGS="$*" \
      bench/durable.sh > "$OUT/$which-$r.md" 2> "$OUT/$which-$r.log" || echo "failed $which $r"
    tail -n +3 "$OUT/$which-$r.md" | sed "s/^/$which r$r /"
  done
done
