//! A supervisor that sends SIGTERM the moment `switchyard serve` prints its banner gets a
//! graceful stop (exit 0), not a process killed by the signal: the handlers are installed
//! before the banner is printed. The real binary in a process of its own, loopback only.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn sigterm_sent_as_the_banner_appears_stops_the_gateway_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_switchyard")))
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .args([
            "--quic-listen",
            "127.0.0.1:0",
            "--ops-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("switchyard serve starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a banner line").unwrap();
    assert_eq!(first, "switchyard gateway running");
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -TERM failed");
    // Drain the rest of the banner so the gateway never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let pid = child.id().to_string();
    let (exited, status) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(child.wait());
    });
    let Ok(status) = status.recv_timeout(Duration::from_secs(30)) else {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        panic!("the gateway did not stop within 30 s of SIGTERM");
    };
    let status = status.unwrap();
    // Killed by the signal, `code()` is None; a graceful stop exits 0.
    assert_eq!(status.code(), Some(0), "stopped by {status}");
}
