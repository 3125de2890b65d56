//! `switchyard bench` end to end: the real binary, tiny runs on each transport and each way into
//! the gateway, checking the JSON it prints (never its timings).
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};

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

/// A loopback TCP forwarder in front of the gateway's gRPC port that counts the connections
/// the gateway is handed.
struct CountingDoor {
    addr: std::net::SocketAddr,
    opened: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingDoor {
    async fn open(gateway_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let opened = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&opened);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", gateway_port)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Self { addr, opened, task }
    }
}

impl Drop for CountingDoor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Connections a `--via VIA --connections K` run through a [`CountingDoor`] opens to the
/// gateway (the producer's, the gRPC workers' and the bench's own status calls).
async fn connections_opened(site: &harness::Site, via: &str, k: &str) -> usize {
    let door = CountingDoor::open(site.port).await;
    let ca = site.data_dir.join("tls").join("ca.pem");
    let args: Vec<String> = [
        "--connect",
        &door.addr.to_string(),
        "--ca",
        &ca.to_string_lossy(),
        "--transport",
        "grpc",
        "--via",
        via,
        "--connections",
        k,
        "--workers",
        "2",
        "--capacity",
        "4",
        "--tasks",
        "40",
        "--outstanding",
        "8",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let report = tokio::task::spawn_blocking(move || {
        bench(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .expect("bench thread");
    assert_eq!(report["outcomes"]["completed"], 40, "{report}");
    assert_eq!(
        report["parameters"]["connections"],
        k.parse::<u64>().expect("K")
    );
    door.opened.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_flag_opens_that_many_producer_connections() {
    let site = harness::Site::new();
    let _gateway = site.serve().await;
    for via in ["unary", "stream"] {
        // Control: K = 1, the producer's one connection beside the workers' and status calls.
        let one = connections_opened(&site, via, "1").await;
        let four = connections_opened(&site, via, "4").await;
        assert_eq!(
            four,
            one + 3,
            "--via {via}: K=4 opens three producer connections more than K=1 ({one})"
        );
    }
}

#[test]
fn connections_with_via_core_is_refused_as_a_usage_error() {
    let output = Command::new(switchyard())
        .args(["bench", "--via", "core", "--connections", "2"])
        .output()
        .expect("switchyard runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--connections"));
}
