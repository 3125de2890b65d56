//! `switchyard bench --cluster N` end to end: the real binary starts nats-server and N
//! `switchyard serve` nodes of its own; the tests check the counts in the JSON it prints (never
//! its timings) and that it leaves no process behind.
//!
//! Skipped with a printed reason when nats-server is missing, unless `CI_REQUIRE_NATS` is set.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use switchyard_test_support::NatsServer;

/// Upper bound on one bench run (it starts 5 processes and runs 3 tiny phases).
const PATIENCE: Duration = Duration::from_secs(240);
const TASKS: u64 = 200;

fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// Whether nats-server is here (else the reason is printed, or the test fails in CI).
fn nats_installed() -> bool {
    NatsServer::start().is_some()
}

/// `switchyard bench ARGS` with stdout and stderr piped.
fn spawn_bench(args: &[&str]) -> Child {
    let mut command = Command::new(switchyard());
    command
        .arg("bench")
        .args(args)
        .env_remove("SWITCHYARD_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().expect("switchyard runs")
}

/// Waits for `child` to exit within [`PATIENCE`], killing it (and failing) past that.
fn finish(mut child: Child) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("switchyard bench did not end within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The processes whose parent is `pid`, from `/proc`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // Fields after the command name's closing parenthesis: state, then the parent.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<u32>().ok());
        if parent == Some(pid) {
            children.push(child);
        }
    }
    children
}

/// Whether `pid` still runs (a zombie counts as gone).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

fn completed(phase: &Value) -> u64 {
    phase["outcomes"]["completed"].as_u64().unwrap_or(0)
}

fn served(phase: &Value) -> u64 {
    phase["served_per_worker"]
        .as_array()
        .expect("served_per_worker")
        .iter()
        .map(|served| served.as_u64().unwrap())
        .sum()
}

#[test]
fn three_nodes_complete_every_dispatch_and_only_the_cross_node_path_uses_nats() {
    if !nats_installed() {
        return;
    }
    let tasks = TASKS.to_string();
    let output = finish(spawn_bench(&[
        "--cluster",
        "3",
        "--transport",
        "mixed",
        "--workers",
        "4",
        "--capacity",
        "4",
        // Below the 16 slots: the local pool never runs out of free slots, so it never
        // announces capacity to the cluster.
        "--outstanding",
        "6",
        "--tasks",
        &tasks,
    ]));
    assert!(
        output.status.success(),
        "bench --cluster failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let report: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(report["mode"], "cluster");
    assert_eq!(report["nodes"], 3);
    // By default each node's runtime gets its share of the cores: ÷ (3 nodes + the bench).
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(report["node_worker_threads"], (cores / 4).clamp(1, 64));
    for name in ["single", "local", "cross"] {
        let phase = &report[name];
        assert_eq!(completed(phase), TASKS, "{name}: every dispatch completed");
        assert_eq!(
            phase["outcomes"].as_object().map(|o| o.len()),
            Some(1),
            "{name}: no other outcome: {}",
            phase["outcomes"]
        );
        assert_eq!(served(phase), TASKS, "{name}: the workers ran each once");
        for peak in phase["peak_in_flight_per_worker"].as_array().unwrap() {
            assert!(peak.as_u64().unwrap() <= 4, "{name}: within capacity");
        }
    }
    assert_eq!(report["local"]["producer_node"], "n1");
    assert_eq!(report["cross"]["producer_node"], "n1");
    let cross_nodes: Vec<&str> = report["cross"]["worker_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node.as_str().unwrap())
        .collect();
    assert_eq!(cross_nodes, ["n2", "n2", "n3", "n3"]);
    // The cross phase starts once the local phase's workers have left n1: its gRPC workers,
    // stopped without a drain, stay suspended there for the reconnect grace (5 s) otherwise.
    // Control: the local phase counts its own four there.
    assert_eq!(report["local"]["producer_node_workers"], 4);
    assert_eq!(report["cross"]["producer_node_workers"], 0);
    // Forwarded dispatches cross NATS: an offer request and its answer (which carries the ends
    // of tasks done within the taker's linger; a longer one adds an outcome message), shared
    // by up to 64 dispatches of a pool under load (docs/cluster.md, Batched offers). So some
    // messages per dispatch, and never more than the unbatched three.
    let cross = report["cross"]["nats_messages_per_dispatch"]
        .as_f64()
        .unwrap();
    assert!(
        cross > 0.0 && cross <= 3.0,
        "cross-node messages per dispatch: {cross}"
    );
    // Control for the same counter: a local dispatch publishes nothing, and neither does a lone
    // node.
    assert_eq!(report["local"]["nats_in_msgs"], 0, "{}", report["local"]);
    assert_eq!(report["local"]["nats_messages_per_dispatch"], 0.0);
    assert_eq!(report["single"]["nats_in_msgs"], 0);
}

#[test]
fn an_interrupted_cluster_bench_leaves_no_process_behind() {
    if !nats_installed() {
        return;
    }
    // Enough dispatches that the run is still going when the signal lands.
    let child = spawn_bench(&[
        "--cluster",
        "2",
        "--workers",
        "2",
        "--tasks",
        "1000000",
        "--service-time-us",
        "1000",
    ]);
    let pid = child.id();
    // nats-server, the lone node and two members.
    let started = Instant::now();
    let mut spawned = children_of(pid);
    while spawned.len() < 4 {
        assert!(
            started.elapsed() < PATIENCE,
            "the bench started only {spawned:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
        spawned = children_of(pid);
    }
    // Control: they run before the signal.
    assert!(spawned.iter().all(|&child| running(child)), "{spawned:?}");
    let sent = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let output = finish(child);
    assert!(!output.status.success(), "an interrupted run is a failure");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("interrupted"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let left: Vec<u32> = spawned
        .into_iter()
        .filter(|&child| running(child))
        .collect();
    assert!(left.is_empty(), "still running after the bench: {left:?}");
}

#[test]
fn a_missing_nats_server_program_is_a_usage_error_naming_the_fix() {
    let output = finish(spawn_bench(&[
        "--cluster",
        "2",
        "--nats-server",
        "/nonexistent/nats-server",
    ]));
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent/nats-server") && stderr.contains("--nats-url"),
        "{stderr}"
    );
    // Control: the flag needs --cluster.
    let alone = finish(spawn_bench(&["--nats-server", "/nonexistent/nats-server"]));
    assert_eq!(alone.status.code(), Some(2));
}
