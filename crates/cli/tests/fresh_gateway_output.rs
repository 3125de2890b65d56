//! What a freshly started `switchyard serve` shows an operator before any traffic: every
//! core series on `/metrics` at zero, and a log that holds no colour codes when it is written
//! to a file — the real binary in a process of its own, loopback only.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `switchyard serve`; killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the gateway with stderr written to `log` and returns it with the ops address from
/// its banner.
fn serve(data_dir: &Path, log: &Path) -> (Serve, String) {
    serve_with(data_dir, log, &[], None, &[])
}

/// [`serve`] with `extra` arguments, `RUST_LOG` set to `rust_log` (unset when `None`) and
/// the variables `env` set.
fn serve_with(
    data_dir: &Path,
    log: &Path,
    extra: &[&str],
    rust_log: Option<&str>,
    env: &[(&str, &str)],
) -> (Serve, String) {
    let log = std::fs::File::create(log).unwrap();
    let mut command = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_switchyard")));
    command
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .args(["--quic-listen", "127.0.0.1:0"])
        .args(["--ops-listen", "127.0.0.1:0", "--log-filter", "info"])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("TOKIO_WORKER_THREADS")
        .envs(env.iter().copied());
    if let Some(filter) = rust_log {
        command.env("RUST_LOG", filter);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("switchyard serve starts");
    let stdout = child.stdout.take().unwrap();
    let (found, ops) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if words.next() == Some("ops") {
                let url = words.next().unwrap_or_default();
                let _ = found.send(url.trim_start_matches("http://").to_owned());
            }
        }
    });
    let serve = Serve(child);
    let ops = ops
        .recv_timeout(Duration::from_secs(30))
        .expect("the banner names the ops listener");
    (serve, ops)
}

fn get(addr: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn a_fresh_gateway_exports_every_core_series_at_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (_serve, ops) = serve(&dir.path().join("data"), &dir.path().join("log"));
    let metrics = get(&ops, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    let series = |name: &str, label: &str, value: &str| format!("{name}{{{label}=\"{value}\"}} 0");
    let mut expected = Vec::new();
    for outcome in switchyard_core::OUTCOME_LABELS {
        expected.push(series("switchyard_dispatches_total", "outcome", outcome));
    }
    for reason in switchyard_core::REFUSED_RESULT_LABELS {
        expected.push(series("switchyard_results_refused_total", "reason", reason));
    }
    for reason in switchyard_core::UNSERVED_LABELS {
        expected.push(series(
            "switchyard_unserved_episodes_total",
            "reason",
            reason,
        ));
    }
    for reason in switchyard_core::ADMISSION_LABELS {
        expected.push(series(
            "switchyard_admission_refusals_total",
            "reason",
            reason,
        ));
    }
    expected.push("switchyard_dispatch_latency_seconds_count 0".to_owned());
    expected.push("switchyard_results_after_cancel_total 0".to_owned());
    let missing: Vec<&String> = expected
        .iter()
        .filter(|line| !metrics.lines().any(|have| have == line.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "missing from a fresh /metrics: {missing:?}\n{metrics}"
    );
}

/// What the gateway on `data_dir` (with `extra` arguments and `RUST_LOG` = `rust_log`) logged
/// to `log` by the time it answered `/healthz` (by then it has logged its start) and was
/// stopped.
fn start_log(data_dir: &Path, log: &Path, extra: &[&str], rust_log: Option<&str>) -> String {
    start_log_with(data_dir, log, extra, rust_log, &[])
}

/// [`start_log`] with the variables `env` set.
fn start_log_with(
    data_dir: &Path,
    log: &Path,
    extra: &[&str],
    rust_log: Option<&str>,
    env: &[(&str, &str)],
) -> String {
    let (serve, ops) = serve_with(data_dir, log, extra, rust_log, env);
    assert!(get(&ops, "/healthz").starts_with("HTTP/1.1 200"));
    drop(serve);
    std::fs::read_to_string(log).unwrap()
}

#[test]
fn a_log_written_to_a_file_holds_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let text = start_log(&dir.path().join("data"), &dir.path().join("log"), &[], None);
    // Control: the file holds real log lines (a level word), so the absence below means
    // something.
    assert!(
        text.contains("INFO"),
        "no INFO line in the log file: {text:?}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "escape codes in a log written to a file: {text:?}"
    );
}

/// The lines the gateway logged to `log` with `--log-json` and `RUST_LOG` = `rust_log`, each
/// parsed as JSON, once it answered `/healthz` and was stopped.
fn json_log(rust_log: Option<&str>) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let (data, log) = (dir.path().join("data"), dir.path().join("log"));
    let text = start_log(&data, &log, &["--log-json"], rust_log);
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect()
}

/// `docs/configuration.md`, `[log]`: `--log-json` writes one JSON object per line, and
/// `RUST_LOG`, when set, wins over the configured filter.
#[test]
fn log_json_writes_one_object_a_line_and_rust_log_wins_over_the_filter() {
    let level = |line: &serde_json::Value| line["level"].as_str().unwrap_or_default().to_owned();
    let filtered = json_log(None);
    assert!(
        filtered.iter().any(|line| level(line) == "INFO"),
        "an INFO object with the configured filter (`info`): {filtered:?}"
    );
    // `RUST_LOG=warn` holds back the INFO the configured filter let through (the line above
    // is the control).
    let warn = json_log(Some("warn"));
    assert!(
        !warn.iter().any(|line| level(line) == "INFO"),
        "RUST_LOG did not win: {warn:?}"
    );
}

/// `docs/configuration.md`, `tls.cert`: the first start generates the development CA and
/// server certificate under `<data_dir>/tls/` and says so, naming the directory and the files;
/// a restart reuses them and says nothing of the kind.
#[test]
fn the_first_start_names_the_generated_tls_files_and_a_restart_reuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let tls = data.join("tls");
    let started = |log: &Path| start_log(&data, log, &[], None);
    let first = started(&dir.path().join("first.log"));
    let line = first
        .lines()
        .find(|line| line.contains("generated new development TLS material"))
        .unwrap_or_else(|| panic!("no generation line: {first}"));
    assert!(line.contains(&tls.display().to_string()), "{line}");
    assert!(line.contains(" WARN "), "logged as a warning: {line}");
    for file in ["ca.pem", "ca-key.pem", "server.pem", "server-key.pem"] {
        assert!(line.contains(file), "{file} not named: {line}");
        assert!(tls.join(file).is_file(), "{file} not written");
    }
    let ca = std::fs::read(tls.join("ca.pem")).unwrap();
    let second = started(&dir.path().join("second.log"));
    // Control: the second log is a real start log, without the generation line.
    assert!(second.contains("INFO"), "{second}");
    assert!(
        !second.contains("generated new development TLS material"),
        "{second}"
    );
    assert_eq!(
        std::fs::read(tls.join("ca.pem")).unwrap(),
        ca,
        "the CA is reused"
    );
}

/// `docs/configuration.md`, `quic.socket_buffer`: the size the kernel granted for the QUIC
/// socket is logged at start, with the size asked (4 MiB by default) and the bound address.
#[test]
fn the_granted_quic_socket_buffer_is_logged_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let text = start_log(&dir.path().join("data"), &dir.path().join("log"), &[], None);
    let line = text
        .lines()
        .find(|line| line.contains("QUIC socket buffers") || line.contains("QUIC receive buffer"))
        .unwrap_or_else(|| panic!("no socket buffer line: {text}"));
    assert!(line.contains("asked=4194304"), "{line}");
    let granted = field(line, "receive=");
    assert!(
        granted.parse::<u64>().is_ok_and(|bytes| bytes > 0),
        "the granted size: {line}"
    );
    // The address bound, with the port the kernel chose (asked: port 0).
    let port = field(line, "addr=127.0.0.1:");
    assert!(
        port.parse::<u16>().is_ok_and(|port| port != 0),
        "the bound address: {line}"
    );
}

/// The text after `key` in a log line, up to the next space.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(key)
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// `docs/cluster.md`, "Several nodes on one machine": `serve` logs its async runtime's worker
/// threads at start, one per core by default, and tokio's `TOKIO_WORKER_THREADS` sets them.
#[test]
fn the_runtime_s_worker_threads_are_logged_and_tokio_worker_threads_sets_them() {
    let threads = |env: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let text = start_log_with(
            &dir.path().join("data"),
            &dir.path().join("log"),
            &[],
            None,
            env,
        );
        let line = text
            .lines()
            .find(|line| line.contains("async runtime"))
            .unwrap_or_else(|| panic!("no runtime line: {text}"));
        field(line, "worker_threads=").parse::<usize>().unwrap()
    };
    assert_eq!(threads(&[("TOKIO_WORKER_THREADS", "1")]), 1);
    assert_eq!(threads(&[("TOKIO_WORKER_THREADS", "3")]), 3);
    // Control: unset, one per core.
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(threads(&[]), cores);
}
