#!/bin/bash
# Interleaved before/after cluster bench runs, nodes on one runtime thread; max_us of the cross phase.
for i in $(seq 1 15); do
  for b in before after; do
    if [ $b = before ]; then BIN=/tmp/before/switchyard; else BIN=/work/reltarget2/release/switchyard; fi
    $BIN bench --cluster 3 --workers 4 --capacity 64 --outstanding 256 --tasks 100000 --payload 64 --node-worker-threads 1 > $b-$i.json 2>$b-$i.err
    python3 -c "
import json; d=json.load(open('$b-$i.json'))['cross']; print('$b', $i, int(d['tasks_per_sec']), d['max_us'])" >> summary.txt
  done
done
echo finished >> summary.txt
