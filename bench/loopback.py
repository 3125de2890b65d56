#!/usr/bin/env python3
"""Loopback throughput/latency table for docs/benchmarks.md.

Runs `switchyard bench` (release build: `cargo build --release -p switchyard`) RUNS times for
each transport and `--via`, with the issue's parameters (W=4, C=64, P=256, 64-byte payload,
zero service time), and prints one Markdown row per configuration: the median of each figure
with its min-max. Every run's JSON is also written to
bench/results/loopback-<transport>-<via>-<n>.json when --keep is given.

Usage: bench/loopback.py [--runs 3] [--tasks 200000] [--transports grpc,quic,mixed]
                         [--vias stream,unary,core] [--keep]
Bounded: each run has its own deadlines (see `switchyard bench --help`) and a 300 s timeout.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, "target", "release", "switchyard")


def run_once(transport, via, tasks):
    command = [
        BINARY, "bench", "--transport", transport, "--via", via, "--workers", "4",
        "--capacity", "64", "--tasks", str(tasks), "--outstanding", "256", "--payload", "64",
        "--service-time-us", "0",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def cell(values, fmt):
    values = sorted(values)
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--transports", default="grpc,quic,mixed")
    parser.add_argument("--vias", default="stream,unary,core")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.runs <= 20 or not 1 <= args.tasks <= 5_000_000:
        sys.exit("--runs must be 1..20 and --tasks 1..5,000,000")
    print("| transport | via | dispatches/s | p50 µs | p99 µs | p99.9 µs | CPU µs/dispatch "
          "| peak in flight / C | outcomes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for transport in args.transports.split(","):
        for via in args.vias.split(","):
            reports = []
            for n in range(args.runs):
                report = run_once(transport, via, args.tasks)
                reports.append(report)
                if args.keep:
                    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
                    path = os.path.join(ROOT, "bench", "results",
                                        f"loopback-{transport}-{via}-{n}.json")
                    with open(path, "w", encoding="utf-8") as out:
                        json.dump(report, out, indent=1)
            integer = lambda v: f"{v:,.0f}"
            one = lambda v: f"{v:.1f}"
            peak = max(max(r["peak_in_flight_per_worker"]) for r in reports)
            outcomes = {}
            for r in reports:
                for label, count in r["outcomes"].items():
                    outcomes[label] = outcomes.get(label, 0) + count
            print(f"| {transport} | {via} "
                  f"| {cell([r['tasks_per_sec'] for r in reports], integer)} "
                  f"| {cell([r['p50_us'] for r in reports], integer)} "
                  f"| {cell([r['p99_us'] for r in reports], integer)} "
                  f"| {cell([r['p999_us'] for r in reports], integer)} "
                  f"| {cell([r['cpu_us_per_dispatch'] or float('nan') for r in reports], one)} "
                  f"| {peak} / 64 "
                  f"| {', '.join(f'{k} {v:,}' for k, v in sorted(outcomes.items()))} |",
                  flush=True)


if __name__ == "__main__":
    main()
