#!/bin/bash
# usage: ab.sh PAIRS TASKS BEFORE AFTER [extra bench args]
P=$1; T=$2; A=$3; B=$4; shift 4
for i in $(seq $P); do
 for b in $A $B; do
  $b bench --durable --via stream --workers 4 --capacity 64 --outstanding 256 --tasks $T --payload 64 "$@" 2>/dev/null | python3 -c "import json,sys;d=json.load(sys.stdin);print('%-22s %8.0f/s p99 %6d cpu %5.1f load %.1f'%(sys.argv[1],d['tasks_per_sec'],d['p99_us'],d['cpu_us_per_dispatch'],d['load_average_1m']))" $b
 done
done
