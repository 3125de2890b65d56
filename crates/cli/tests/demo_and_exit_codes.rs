//! What the README promises of the binary outside `serve`: `switchyard demo` runs a gateway
//! with a gRPC and a QUIC worker, prints each worker's tasks and peak in-flight against its
//! capacity and the latency percentiles, and exits 0; a client command that cannot reach its
//! gateway exits 1 (a run-time failure), a bad argument 2.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn switchyard() -> Command {
    Command::new(PathBuf::from(env!("CARGO_BIN_EXE_switchyard")))
}

/// Runs `command` to its end, bounded by two minutes.
fn run(mut command: Command) -> Output {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after two minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn demo_serves_over_both_transports_within_capacity_and_exits_0() {
    let mut command = switchyard();
    command.args([
        "demo",
        "--tasks",
        "300",
        "--capacity",
        "4",
        "--in-flight",
        "8",
    ]);
    let output = run(command);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    // One row per worker: id, transport, tasks served, "peak / capacity".
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|line| !line.starts_with("WORKER"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .map(|line| line.split_whitespace().collect())
        .collect();
    let transports: Vec<&str> = rows.iter().map(|row| row[1]).collect();
    assert_eq!(transports, ["grpc", "quic"], "{stdout}");
    let mut served = 0;
    for row in &rows {
        served += row[2].parse::<u32>().unwrap();
        let (peak, capacity) = (row[3].parse::<u32>().unwrap(), row[5]);
        assert_eq!(capacity, "4", "{stdout}");
        assert!(
            (1..=4).contains(&peak),
            "peak {peak} past capacity: {stdout}"
        );
    }
    assert_eq!(served, 300, "{stdout}");
    assert!(
        stdout.contains("300 of 300 dispatches completed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("dispatch latency: p50 ") && stdout.contains(" p99 "),
        "{stdout}"
    );
}

#[test]
fn a_client_that_cannot_reach_its_gateway_exits_1_and_a_bad_argument_2() {
    let ca = switchyard_test_support::TestCa::new("nobody's ca");
    let dir = tempfile::tempdir().unwrap();
    let ca_path = ca.write_to(dir.path(), "ca.pem");
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = switchyard();
    command
        .args([
            "workers",
            "--endpoint",
            &format!("https://127.0.0.1:{port}"),
        ])
        .arg("--ca")
        .arg(&ca_path);
    let output = run(command);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("switchyard: "), "{stderr}");
    // Control: a usage error is told apart, with 2.
    let mut command = switchyard();
    command.args(["workers", "--no-such-flag"]);
    assert_eq!(run(command).status.code(), Some(2));
}
