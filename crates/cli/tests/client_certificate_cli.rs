//! The command-line client presents a client certificate with `--cert`/`--key`: against a
//! gateway that requires one (`tls.require_client_cert`), `switchyard workers` gets in with the
//! certificate and is refused without it — the real binary, `switchyard serve` in a process of
//! its own, loopback only.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use switchyard_test_support::TestCa;

fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// A client CA and a client certificate for `common_name` signed by it, written to `dir`;
/// returns (CA path, certificate path, key path).
fn client_certificates(dir: &Path, common_name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca = TestCa::new("test client CA");
    let ca_path = ca.write_to(dir, "client-ca.pem");
    let (cert, key) = ca
        .client(common_name)
        .write_to(dir, "client.pem", "client-key.pem");
    (ca_path, cert, key)
}

/// `switchyard serve` requiring client certificates; killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the gateway and returns it with its gRPC port, read from the banner it prints.
fn serve(data_dir: &Path, client_ca: &Path) -> (Serve, u16) {
    let mut child = Command::new(switchyard())
        .args(["serve", "--no-quic", "--grpc-listen", "127.0.0.1:0"])
        .args(["--ops-listen", "127.0.0.1:0", "--log-filter", "error"])
        .arg("--data-dir")
        .arg(data_dir)
        .env("SWITCHYARD_TLS_CLIENT_CA", client_ca)
        .env("SWITCHYARD_TLS_REQUIRE_CLIENT_CERT", "true")
        .env(
            "SWITCHYARD_PRINCIPALS",
            r#"[{ name = "operator", cert_subject = "ops.example", namespaces = ["*"] }]"#,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("switchyard serve starts");
    let stdout = child.stdout.take().unwrap();
    let (found, port) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            if words.next() == Some("grpc") {
                let addr = words.last().unwrap_or_default().to_owned();
                let _ = found.send(addr);
            }
        }
    });
    let serve = Serve(child);
    let addr = port
        .recv_timeout(Duration::from_secs(30))
        .expect("the banner names the gRPC listener");
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"));
    (serve, port)
}

fn workers(port: u16, data_dir: &Path, identity: Option<(&Path, &Path)>) -> Output {
    let mut command = Command::new(switchyard());
    command
        .args([
            "workers",
            "--endpoint",
            &format!("https://127.0.0.1:{port}"),
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("SWITCHYARD_CLIENT_CERT")
        .env_remove("SWITCHYARD_CLIENT_KEY")
        .env_remove("SWITCHYARD_TOKEN");
    if let Some((cert, key)) = identity {
        command.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    command.output().expect("switchyard workers runs")
}

#[test]
fn cli_commands_present_the_client_certificate_given_with_cert_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = client_certificates(dir.path(), "ops.example");
    let data_dir = dir.path().join("data");
    let (_serve, port) = serve(&data_dir, &ca);

    let with = workers(port, &data_dir, Some((&cert, &key)));
    assert!(
        with.status.success(),
        "with --cert/--key: {}",
        String::from_utf8_lossy(&with.stderr)
    );

    // Control: the same command without the certificate is refused in the handshake.
    let without = workers(port, &data_dir, None);
    assert!(!without.status.success(), "got in without a certificate");

    // Half an identity is a usage error, named.
    let half = Command::new(switchyard())
        .args([
            "workers",
            "--endpoint",
            &format!("https://127.0.0.1:{port}"),
        ])
        .arg("--cert")
        .arg(&cert)
        .env_remove("SWITCHYARD_CLIENT_KEY")
        .output()
        .unwrap();
    assert!(!half.status.success());
    assert!(
        String::from_utf8_lossy(&half.stderr).contains("--key"),
        "{}",
        String::from_utf8_lossy(&half.stderr)
    );
}
