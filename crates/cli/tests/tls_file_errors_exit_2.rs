//! TLS files the configuration names that cannot be read stop `switchyard serve` with exit
//! code 2 (a configuration error) and a message naming the key — the real binary, loopback.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `switchyard serve` with `tls.cert` and `tls.key` set, and waits (bounded) for it to
/// exit.
fn serve_with(data_dir: &Path, cert: &Path, key: &Path) -> Output {
    let mut child = Command::new(PathBuf::from(env!("CARGO_BIN_EXE_switchyard")))
        .args(["serve", "--grpc-listen", "127.0.0.1:0"])
        .args([
            "--quic-listen",
            "127.0.0.1:0",
            "--ops-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .env("SWITCHYARD_TLS_CERT", cert)
        .env("SWITCHYARD_TLS_KEY", key)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("switchyard serve starts");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("switchyard serve did not exit on a missing TLS file");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_missing_key_file_exits_2_naming_tls_key() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("server.pem");
    std::fs::write(&cert, "not yet parsed").unwrap();
    let key = dir.path().join("missing-key.pem");
    let output = serve_with(&dir.path().join("data"), &cert, &key);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("tls.key: {}", key.display())),
        "{stderr}"
    );
    // Control: the cert missing instead names tls.cert, not tls.key.
    let missing_cert = dir.path().join("missing-cert.pem");
    let output = serve_with(&dir.path().join("data"), &missing_cert, &key);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tls.cert: "), "{stderr}");
    assert!(!stderr.contains("tls.key: "), "{stderr}");
}
