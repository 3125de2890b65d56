//! End-to-end: the `linkem` binary joins two real namespaces, and UDP probes run inside them
//! see the configured loss and delay.
//!
//! The emulator tests need root and `/dev/net/tun`; without them they print why and pass.
//! Every name is unique to this process and test, every wait is bounded, and a drop guard
//! kills what a test started and deletes its namespaces even when an assertion fails.
// The helpers below are test code too: a failed expectation in them is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const LINKEM: &str = env!("CARGO_BIN_EXE_linkem");
const ADDR_A: &str = "10.77.0.1";
const ADDR_B: &str = "10.77.0.2";
const STARTUP: Duration = Duration::from_secs(10);

#[test]
fn random_loss_on_10000_udp_packets_is_within_binomial_tolerance() {
    if !can_emulate() {
        return;
    }
    const SENT: u64 = 10_000;
    const LOSS: f64 = 0.05;
    let emulator = Emulator::start('l', &["--loss", "5%", "--seed", "7", "--delay", "1ms"]);
    let sink = Probe::start(
        &emulator.names.ns_b,
        &[
            "udp-sink",
            "--bind",
            &format!("{ADDR_B}:9000"),
            "--expect",
            &SENT.to_string(),
            "--idle",
            "1s",
            "--limit",
            "20s",
        ],
    );
    sink.wait_ready();
    let sender = Probe::start(
        &emulator.names.ns_a,
        &[
            "udp-send",
            "--to",
            &format!("{ADDR_B}:9000"),
            "--count",
            &SENT.to_string(),
            "--size",
            "64",
            "--pps",
            "10000",
        ],
    );
    let sent = sender.finish(Duration::from_secs(20));
    let received = sink.finish(Duration::from_secs(20));
    let stats = emulator.stop();

    assert_eq!(sent["sent"], SENT, "sender: {sent}");
    let received = received["distinct"].as_u64().unwrap();
    let dropped = SENT - received;
    let expected = SENT as f64 * LOSS;
    let tolerance = 4.5 * (SENT as f64 * LOSS * (1.0 - LOSS)).sqrt();
    let a_to_b = &stats["a_to_b"];
    let lost = a_to_b["lost"].as_u64().unwrap();
    eprintln!(
        "loss: sent {SENT}, received {received}, dropped {dropped} ({:.2}%; {lost} by the \
         emulator), expected {expected} ± {tolerance:.0}",
        dropped as f64 * 100.0 / SENT as f64
    );
    assert!(
        (dropped as f64 - expected).abs() <= tolerance,
        "dropped {dropped}, expected {expected} ± {tolerance}"
    );
    // The drops are the emulator's: it counted them, and at most a handful went missing
    // elsewhere (a kernel queue overflowing while a loaded machine stalls the emulator or the
    // sink).
    assert!(lost <= dropped, "emulator: {a_to_b}");
    assert!(
        dropped - lost <= SENT / 200,
        "lost outside the emulator: {a_to_b}"
    );
    assert!(
        a_to_b["offered"].as_u64().unwrap() >= SENT - SENT / 200,
        "emulator: {a_to_b}"
    );
}

#[test]
fn one_way_delay_shows_in_the_round_trip_of_a_udp_echo() {
    if !can_emulate() {
        return;
    }
    const ONE_WAY_MS: u64 = 25;
    const PINGS: u64 = 20;
    let emulator = Emulator::start('d', &["--delay", &format!("{ONE_WAY_MS}ms")]);
    let echo = Probe::start(
        &emulator.names.ns_b,
        &[
            "udp-echo",
            "--bind",
            &format!("{ADDR_B}:9001"),
            "--count",
            &PINGS.to_string(),
            "--idle",
            "5s",
            "--limit",
            "20s",
        ],
    );
    echo.wait_ready();
    let ping = Probe::start(
        &emulator.names.ns_a,
        &[
            "udp-ping",
            "--to",
            &format!("{ADDR_B}:9001"),
            "--count",
            &PINGS.to_string(),
            "--timeout",
            "2s",
        ],
    );
    let report = ping.finish(Duration::from_secs(30));
    echo.finish(Duration::from_secs(10));
    emulator.stop();

    assert_eq!(report["received"], PINGS, "ping: {report}");
    let rtts: Vec<u64> = report["rtt_us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let min = *rtts.iter().min().unwrap();
    let max = *rtts.iter().max().unwrap();
    let mut sorted = rtts.clone();
    sorted.sort_unstable();
    eprintln!(
        "delay: one-way {ONE_WAY_MS} ms, RTT min {:.2} ms, median {:.2} ms, max {:.2} ms",
        min as f64 / 1e3,
        sorted[sorted.len() / 2] as f64 / 1e3,
        max as f64 / 1e3
    );
    let floor_us = 2 * ONE_WAY_MS * 1000;
    assert!(
        min >= floor_us,
        "RTT {min} µs below twice the one-way delay"
    );
    // Generous: a loaded 2-core machine schedules late, but never by half a second.
    assert!(max < floor_us + 500_000, "RTT {max} µs");
}

#[test]
fn a_failed_setup_removes_the_namespace_it_had_created() {
    if !can_emulate() {
        return;
    }
    let names = Names::new('f');
    // Side B's namespace exists already, so setup fails after creating side A's.
    let _b = TempNamespace::create(&names.ns_b);
    let output = Command::new(LINKEM)
        .args(names.run_args())
        .args(["--duration", "5s"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("exists already"), "stderr: {stderr}");
    assert!(
        !namespace_exists(&names.ns_a),
        "side A's namespace was left behind"
    );
    assert!(
        namespace_exists(&names.ns_b),
        "a namespace linkem did not create was removed"
    );
}

#[test]
fn help_documents_every_flag_and_profile() {
    let output = Command::new(LINKEM).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--profile",
        "--delay",
        "--jitter",
        "--reorder",
        "--loss",
        "--rate",
        "--burst",
        "--queue",
        "--hold-limit",
        "--seed",
        "--duration",
        "--ns-a",
        "--ns-b",
        "--dev-a",
        "--dev-b",
        "--addr-a",
        "--addr-b",
        "--mtu",
        "--txqueuelen",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
    }
    for profile in ["lan", "wan", "lossy", "cellular-bad"] {
        assert!(help.contains(profile), "--help does not mention {profile}");
    }
    for figure in [
        "40 ms RTT",
        "100 ms RTT",
        "300 ms RTT",
        "0.1% loss",
        "50 Mbit/s",
    ] {
        assert!(help.contains(figure), "--help does not give {figure}");
    }
    assert!(help.contains("cleanup"));
}

/// Whether this process can create namespaces and TUN devices; says why not if it cannot.
fn can_emulate() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            // Real, effective, saved, filesystem: the effective one decides.
            line.split_whitespace().nth(2).map(|uid| uid == "0")
        })
        .unwrap_or(false);
    if !(root && Path::new("/dev/net/tun").exists()) {
        eprintln!("skipped: needs root and /dev/net/tun");
        return false;
    }
    let ip_runs = Command::new(ip_program())
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ip_runs {
        eprintln!("skipped: needs iproute2's `ip`");
        return false;
    }
    true
}

/// iproute2's `ip`, wherever the distribution put it.
fn ip_program() -> &'static str {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("ip")
}

fn namespace_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Namespace and device names unique to this process and test.
struct Names {
    ns_a: String,
    ns_b: String,
    dev_a: String,
    dev_b: String,
}

impl Names {
    fn new(tag: char) -> Self {
        let pid = std::process::id();
        Self {
            ns_a: format!("lkt-{pid}-{tag}-a"),
            ns_b: format!("lkt-{pid}-{tag}-b"),
            // At most 15 characters: "lk" + up to 7 pid digits + tag + side.
            dev_a: format!("lk{pid}{tag}a"),
            dev_b: format!("lk{pid}{tag}b"),
        }
    }

    fn run_args(&self) -> Vec<String> {
        [
            ("--ns-a", &self.ns_a),
            ("--ns-b", &self.ns_b),
            ("--dev-a", &self.dev_a),
            ("--dev-b", &self.dev_b),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value.clone()])
        .chain(["--addr-a".into(), format!("{ADDR_A}/30")])
        .chain(["--addr-b".into(), format!("{ADDR_B}/30")])
        .collect()
    }
}

/// A child process whose stdout JSON lines arrive on a channel; killed on drop.
struct Lines {
    child: Child,
    lines: Receiver<Value>,
}

impl Lines {
    fn spawn(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str(&line) {
                    if tx.send(value).is_err() {
                        return;
                    }
                }
            }
        });
        Self { child, lines }
    }

    /// The next line whose `event` is `event`, within `timeout`.
    fn expect(&self, event: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(value) if value["event"] == event => return value,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("no {event:?} line within {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("process exited before a {event:?} line")
                }
            }
        }
    }

    /// Waits for the process to exit after its last line (bounded by the reader's timeout).
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `linkem` run on unique names; stopped with SIGTERM, or killed and cleaned up on drop.
struct Emulator {
    process: Lines,
    names: Names,
}

impl Emulator {
    fn start(tag: char, link_args: &[&str]) -> Self {
        let names = Names::new(tag);
        let mut command = Command::new(LINKEM);
        command.args(names.run_args()).args(link_args);
        // A run that the test forgets to stop still ends by itself.
        command.args(["--duration", "60s"]);
        let process = Lines::spawn(command);
        let emulator = Self { process, names };
        emulator.process.expect("ready", STARTUP);
        emulator
    }

    /// Stops the run with SIGTERM and returns its final counters, checking that it removed
    /// its namespaces.
    fn stop(mut self) -> Value {
        let pid = self.process.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let stopped = self.process.expect("stopped", Duration::from_secs(10));
        assert!(self.process.wait_exit().success());
        for ns in [&self.names.ns_a, &self.names.ns_b] {
            assert!(!namespace_exists(ns), "{ns} left behind");
        }
        stopped
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if matches!(self.process.child.try_wait(), Ok(None)) {
            let _ = self.process.child.kill();
            let _ = self.process.child.wait();
        }
        let _ = Command::new(LINKEM)
            .args(["cleanup", "--ns-a", &self.names.ns_a])
            .args(["--ns-b", &self.names.ns_b])
            .status();
    }
}

/// A hidden `linkem` probe subcommand run inside a namespace.
struct Probe {
    process: Lines,
}

impl Probe {
    fn start(namespace: &str, args: &[&str]) -> Self {
        let mut command = Command::new(ip_program());
        command
            .args(["netns", "exec", namespace, LINKEM])
            .args(args);
        Self {
            process: Lines::spawn(command),
        }
    }

    fn wait_ready(&self) {
        self.process.expect("ready", STARTUP);
    }

    /// The probe's report, once it has finished by itself.
    fn finish(mut self, timeout: Duration) -> Value {
        let done = self.process.expect("done", timeout);
        assert!(self.process.wait_exit().success());
        done["report"].clone()
    }
}

/// A namespace created by the test itself, deleted on drop.
struct TempNamespace(String);

impl TempNamespace {
    fn create(name: &str) -> Self {
        let status = Command::new(ip_program())
            .args(["netns", "add", name])
            .status()
            .unwrap();
        assert!(status.success(), "ip netns add {name}");
        Self(name.to_owned())
    }
}

impl Drop for TempNamespace {
    fn drop(&mut self) {
        let _ = Command::new(ip_program())
            .args(["netns", "del", &self.0])
            .status();
    }
}
