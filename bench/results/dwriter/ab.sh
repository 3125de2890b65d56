#!/usr/bin/env bash
# Interleaved before/after rounds of bench/durable.sh; usage: ab.sh OUTDIR ROUNDS TASKS CONFIGS...
set -euo pipefail
cd /work/wt/dwriter
OUT=$1; N=$2; T=$3; shift 3
mkdir -p "$OUT"
for r in $(seq "$N"); do
  for which in before after; do
    BINDIR=reltarget/$which
    uptime > "$OUT/$which-$r.load"
    RESULTS="$OUT/$which-$r" BIN=$BINDIR ROUNDS=1 TASKS=$T CONFIGS="$*" bench/durable.sh > "$OUT/$which-$r.md" 2> "$OUT/$which-$r.log" || echo "failed $which $r"
    cat "$OUT/$which-$r.md" | tail -n +3 | sed "s/^/$which r$r /"
  done
done
