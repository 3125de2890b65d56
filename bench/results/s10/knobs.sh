#!/usr/bin/env bash
# Experiment-build knobs (SYDX_*, not in the committed code), interleaved; usage: knobs.sh BIN TASKS ROUNDS
BIN=$1; T=$2; N=$3
W=$(dirname "$0")/wcpu.sh
for r in $(seq "$N"); do
  for via in stream submit; do
    for knob in NONE SYDX_HOLD_MS=25 SYDX_CKPT=10000 SYDX_NOCLAIMHOLD=1 SYDX_V1IDX=1; do
      if [ "$via" = stream ] && [ "$knob" = SYDX_V1IDX=1 ]; then continue; fi
      if [ "$via" = submit ] && [ "$knob" = SYDX_HOLD_MS=25 ]; then continue; fi
      echo -n "r$r $via $knob: "
      env $([ "$knob" = NONE ] || echo "$knob") "$W" "$BIN" "$via" "$T"
    done
  done
done
