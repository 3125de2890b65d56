#!/usr/bin/env bash
# Interleaved rounds: gRPC via stream, QUIC via stream with quinn's defaults, QUIC via stream
# with send fairness off and an ACK threshold of 8 (both ends), one binary.
# Usage: ab.sh OUT BIN ROUNDS TASKS
set -euo pipefail
here=$(dirname "$0")
out=$1; bin=$2; rounds=${3:-3}; tasks=${4:-200000}
for r in $(seq 1 "$rounds"); do
  "$here/stat.sh" "$out" grpc "$bin" --transport grpc --via stream --tasks "$tasks"
  "$here/stat.sh" "$out" quic-default "$bin" --transport quic --via stream --tasks "$tasks"
  "$here/stat.sh" "$out" quic-tuned "$bin" --transport quic --via stream --tasks "$tasks" \
      --quic-send-fairness false --quic-ack-threshold 8
done
