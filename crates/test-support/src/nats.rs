//! A real NATS server (with JetStream on file storage) for the tests that need one, on a
//! loopback port of its own, stopped when dropped.
//!
//! The server is the `nats-server` program on `PATH` (`.ci/run` installs Debian's). Where it is
//! missing, [`NatsServer::start`] returns `None` after printing why, so the test can skip —
//! unless `CI_REQUIRE_NATS` is set (`.ci/run` sets it), where a missing server fails
//! the test instead of skipping it.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::pki::TestCa;
use crate::within::PATIENCE;

/// The environment variable that turns "nats-server missing: skip" into a failure.
pub const REQUIRE_NATS: &str = "CI_REQUIRE_NATS";

/// A running `nats-server -js` on `127.0.0.1`, its store in a directory of its own; killed (and
/// its directory removed) on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    addr: SocketAddr,
    dir: PathBuf,
    /// The TLS arguments of a server started with [`NatsServer::start_tls`].
    tls: Vec<OsString>,
}

impl NatsServer {
    /// Starts a server on a free loopback port and waits until it is ready; `None` (with the
    /// reason printed) when `nats-server` is not installed and [`REQUIRE_NATS`] is unset.
    ///
    /// # Panics
    /// When the server is missing and [`REQUIRE_NATS`] is set, or it does not become ready
    /// within [`PATIENCE`].
    pub fn start() -> Option<Self> {
        Self::start_with(|_| Vec::new())
    }

    /// As [`NatsServer::start`], the server requiring TLS with a certificate `ca` issued for
    /// `localhost` and `127.0.0.1`; with `verify_clients`, clients must present a certificate
    /// of `ca` too.
    ///
    /// # Panics
    /// As [`NatsServer::start`].
    pub fn start_tls(ca: &TestCa, verify_clients: bool) -> Option<Self> {
        Self::start_with(|dir| {
            let (cert, key) = ca.server().write_to(dir, "server.pem", "server-key.pem");
            let mut args: Vec<OsString> = vec![
                "--tls".into(),
                "--tlscert".into(),
                cert.into(),
                "--tlskey".into(),
                key.into(),
            ];
            if verify_clients {
                args.push("--tlsverify".into());
                args.push("--tlscacert".into());
                args.push(ca.write_to(dir, "ca.pem").into());
            }
            args
        })
    }

    /// Starts a server with the extra arguments `tls` gives for its directory.
    fn start_with(tls: impl FnOnce(&Path) -> Vec<OsString>) -> Option<Self> {
        if !installed() {
            assert!(
                std::env::var_os(REQUIRE_NATS).is_none(),
                "nats-server is not on PATH and {REQUIRE_NATS} is set (install it: apt-get install -y nats-server)"
            );
            eprintln!(
                "skipped: nats-server is not on PATH (Debian: apt-get install -y nats-server)"
            );
            return None;
        }
        let addr = free_port();
        let dir = scratch_dir();
        let tls = tls(&dir);
        let mut server = Self {
            child: None,
            addr,
            dir,
            tls,
        };
        server.restart();
        Some(server)
    }

    /// The `nats://127.0.0.1:PORT` URL clients connect to.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The server's client address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Kills the server with SIGKILL (its JetStream store stays on disk) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and store (after [`NatsServer::kill`]), waiting
    /// until it is ready.
    ///
    /// # Panics
    /// When it does not become ready within [`PATIENCE`].
    pub fn restart(&mut self) {
        self.kill();
        let log = self.dir.join("nats.log");
        let _ = fs::remove_file(&log);
        let child = Command::new("nats-server")
            .arg("-js")
            .arg("-sd")
            .arg(self.dir.join("jetstream"))
            .arg("-a")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(self.addr.port().to_string())
            .arg("-l")
            .arg(&log)
            .args(&self.tls)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        self.child = Some(child);
        wait_ready(&log, self.addr);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether `nats-server` runs here.
fn installed() -> bool {
    Command::new("nats-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A loopback port nothing listens on at this instant.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("bind a loopback port for nats-server")
}

/// A fresh directory for one server's store and log.
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "switchyard-nats-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).expect("create the nats-server scratch directory");
    dir
}

/// Waits until the log says the server is ready and its port accepts, bounded by [`PATIENCE`].
fn wait_ready(log: &Path, addr: SocketAddr) {
    let started = Instant::now();
    loop {
        let mut text = String::new();
        let ready = fs::File::open(log)
            .and_then(|mut file| file.read_to_string(&mut text))
            .is_ok()
            && text.contains("Server is ready")
            && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
        if ready {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "nats-server on {addr} not ready within {PATIENCE:?}; log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
