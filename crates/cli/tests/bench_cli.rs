//! `switchyard bench` end to end: the real binary, tiny runs on each transport and each way into
//! the gateway, checking the JSON it prints (never its timings).
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The `switchyard` binary cargo built for this test.
fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// Runs `switchyard bench ARGS` and parses the one JSON object it prints.
fn bench(args: &[&str]) -> Value {
    let output = Command::new(switchyard())
        .arg("bench")
        .args(args)
        .output()
        .expect("switchyard runs");
    assert!(
        output.status.success(),
        "switchyard bench {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stdout: {stdout}");
    serde_json::from_str(lines[0]).expect("one JSON object")
}

const WORKERS: u64 = 2;
const CAPACITY: u64 = 4;
const TASKS: u64 = 60;

/// A tiny load run; checks every field and that each dispatch completed within capacity.
fn load_run(transport: &str, via: &str) {
    load_run_with(transport, via, &[]);
}

/// [`load_run`] with `extra` flags.
fn load_run_with(transport: &str, via: &str, extra: &[&str]) {
    let (workers, capacity, tasks) = (WORKERS.to_string(), CAPACITY.to_string(), TASKS.to_string());
    let mut args = vec![
        "--transport",
        transport,
        "--via",
        via,
        "--workers",
        &workers,
        "--capacity",
        &capacity,
        "--tasks",
        &tasks,
        "--outstanding",
        "16",
        "--payload",
        "32",
    ];
    args.extend_from_slice(extra);
    let report = bench(&args);
    assert_eq!(report["mode"], "load");
    assert_eq!(
        report["parameters"]["durable"],
        extra.contains(&"--durable"),
        "the report says whether the dispatches were durable"
    );
    assert_eq!(report["parameters"]["transport"], transport);
    assert_eq!(report["parameters"]["via"], via);
    assert_eq!(report["parameters"]["tasks"], TASKS);
    for field in [
        "elapsed_s",
        "tasks_per_sec",
        "p50_us",
        "p90_us",
        "p99_us",
        "p999_us",
        "max_us",
    ] {
        assert!(
            report[field].as_f64().is_some_and(|v| v > 0.0),
            "{field} is a positive number in {report}"
        );
    }
    assert!(report["p50_us"].as_u64() <= report["p99_us"].as_u64());
    assert!(report["p99_us"].as_u64() <= report["max_us"].as_u64());
    assert_eq!(
        report["outcomes"],
        serde_json::json!({ "completed": TASKS }),
        "every dispatch completed"
    );
    let peaks = report["peak_in_flight_per_worker"]
        .as_array()
        .expect("peaks array");
    assert_eq!(peaks.len() as u64, WORKERS);
    for peak in peaks {
        let peak = peak.as_u64().expect("peak is a count");
        assert!(
            peak <= CAPACITY,
            "a worker held {peak} > capacity {CAPACITY}"
        );
    }
    let served: u64 = report["served_per_worker"]
        .as_array()
        .expect("served array")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(served, TASKS, "the workers ran each dispatch once");
    assert_eq!(report["executions"], TASKS, "counted inside the handlers");
    assert_eq!(report["duplicate_executions"], 0);
    assert!(
        report["gateway_peak_rss_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
    );
    assert_eq!(report["rss_includes_bench"], true);
    assert!(report.get("cpu_us_per_dispatch").is_some());
    // Durable runs leave their dispatches in the gateway's store; ephemeral runs (the control)
    // leave none.
    let stored = if extra.contains(&"--durable") {
        TASKS
    } else {
        0
    };
    assert_eq!(
        report["stored_dispatches"], stored,
        "finished dispatches in the store"
    );
}

#[test]
fn grpc_via_stream_completes_every_dispatch() {
    load_run("grpc", "stream");
}

#[test]
fn quic_via_stream_completes_every_dispatch() {
    load_run("quic", "stream");
}

#[test]
fn mixed_via_stream_completes_every_dispatch() {
    load_run("mixed", "stream");
}

#[test]
fn quic_with_datagram_redundancy_completes_every_dispatch_once() {
    load_run_with("quic", "stream", &["--redundancy", "datagram"]);
}

#[test]
fn grpc_via_core_completes_every_dispatch() {
    load_run("grpc", "core");
}

#[test]
fn quic_via_core_completes_every_dispatch() {
    load_run("quic", "core");
}

#[test]
fn mixed_via_unary_completes_every_dispatch() {
    load_run("mixed", "unary");
}

#[test]
fn durable_via_stream_completes_every_dispatch_once() {
    load_run_with("grpc", "stream", &["--durable"]);
}

#[test]
fn durable_via_submit_completes_every_dispatch_once() {
    load_run_with("grpc", "submit", &["--durable"]);
}

#[test]
fn durable_on_the_memory_store_completes_every_dispatch_once() {
    load_run_with("grpc", "stream", &["--durable", "--store", "memory"]);
}

#[test]
fn durable_via_unary_completes_every_dispatch_once() {
    load_run_with("mixed", "unary", &["--durable"]);
}

#[test]
fn via_submit_without_durable_is_refused_as_a_usage_error() {
    let output = Command::new(switchyard())
        .args(["bench", "--via", "submit"])
        .output()
        .expect("switchyard runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--via submit needs --durable"));
}

#[test]
fn idle_workers_mode_reports_memory_and_time_to_eligible() {
    let report = bench(&["--idle-workers", "6"]);
    assert_eq!(report["mode"], "idle");
    assert_eq!(report["idle_workers"], 6);
    assert_eq!(report["grpc_workers"], 3);
    assert_eq!(report["quic_workers"], 3);
    assert!(
        report["time_to_eligible_s"]
            .as_f64()
            .is_some_and(|s| s > 0.0)
    );
    assert!(
        report["rss_connected_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0)
    );
    assert!(report["rss_per_worker_bytes"].as_f64().is_some());
}

#[test]
fn via_core_with_connect_is_refused_as_a_usage_error() {
    let output = Command::new(switchyard())
        .args([
            "bench",
            "--via",
            "core",
            "--connect",
            "127.0.0.1:9",
            "--ca",
            "/nonexistent",
        ])
        .output()
        .expect("switchyard runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--via core"));
}
