//! A restarted gateway gets its gRPC workers back by themselves: `switchyard serve` (a config
//! file, loopback, a temporary data directory) with a `switchyard worker --transport grpc`
//! process and an SDK worker in this process; after SIGTERM, and after `kill -9`, a new gateway
//! on the same port and data directory has both registered again and serving within 5 s of
//! being ready. The real binary, loopback only.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_transport_grpc::{ActivityContext, ActivityError, Backoff, GrpcWorker};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// How soon after the new gateway is ready both workers must be back and serving.
const BACK_WITHIN: Duration = Duration::from_secs(5);
/// Upper bound on any other wait.
const PATIENCE: Duration = Duration::from_secs(30);
const CLI_ACTIVITY: &str = "cli-echo";
const SDK_ACTIVITY: &str = "sdk-echo";

fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// A loopback port free at the time of asking.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A process killed on drop, its output lines collected as they come.
struct Process {
    child: Child,
    stdout: mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    fn spawn(command: &mut Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("switchyard starts");
        let (lines, stdout) = mpsc::unbounded_channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let collected = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for a stdout line containing `needle`.
    async fn line_containing(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.stdout.recv().await {
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!(
                "no line containing {needle:?}; stderr: {:?}",
                self.stderr.lock().unwrap()
            ),
        }
    }

    fn stderr_contains(&self, needle: &str) -> bool {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains(needle))
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit, polling (a `Child` has no async wait).
    async fn exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the process did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The gateway's configuration file: gRPC only, on `port`, with its data in `data_dir`.
fn write_config(dir: &Path, port: u16, data_dir: &Path) -> PathBuf {
    let path = dir.join("switchyard.toml");
    let config = format!(
        r#"
[grpc]
listen = "127.0.0.1:{port}"

[quic]
enabled = false

[ops]
enabled = false

[tls]
data_dir = "{}"

[shutdown]
drain_timeout = "2s"

[log]
filter = "warn"
"#,
        data_dir.display()
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// Starts `switchyard serve` and waits for its banner; returns it and the instant it is ready.
async fn serve(config: &Path) -> (Process, Instant) {
    let mut gateway = Process::spawn(
        Command::new(switchyard())
            .arg("serve")
            .arg("--config")
            .arg(config),
    );
    gateway.line_containing("grpc").await;
    (gateway, Instant::now())
}

async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
    Ok(input)
}

fn client_tls(data_dir: &Path) -> ClientTlsConfig {
    let ca = std::fs::read_to_string(data_dir.join("tls").join("ca.pem")).unwrap();
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
}

/// A producer client; `None` while the gateway is not listening.
async fn producer(port: u16, data_dir: &Path) -> Option<GatewayClient<Channel>> {
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(client_tls(data_dir))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .ok()?;
    Some(GatewayClient::new(channel))
}

fn unix_ms(at: SystemTime) -> u64 {
    u64::try_from(at.duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// Polls until a worker for each activity is registered (connected at or after `since`) and
/// one dispatch to each completes, or `deadline` passes.
async fn both_serving(
    port: u16,
    data_dir: &Path,
    since: SystemTime,
    deadline: Instant,
) -> Vec<u64> {
    let since = unix_ms(since);
    loop {
        assert!(
            Instant::now() < deadline,
            "the workers were not back and serving in time"
        );
        if let Some(ids) = try_both_serving(port, data_dir, since).await {
            return ids;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn try_both_serving(port: u16, data_dir: &Path, since: u64) -> Option<Vec<u64>> {
    let mut client = producer(port, data_dir).await?;
    let workers = client
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .ok()?
        .into_inner()
        .workers;
    let mut ids = Vec::new();
    for activity in [CLI_ACTIVITY, SDK_ACTIVITY] {
        let worker = workers.iter().find(|w| {
            w.activity_types.iter().any(|a| a == activity) && w.connected_since_unix_ms >= since
        })?;
        ids.push(worker.worker_id);
    }
    for activity in [CLI_ACTIVITY, SDK_ACTIVITY] {
        let reply = client
            .dispatch(pb::DispatchRequest {
                namespace: "default".into(),
                activity_type: activity.into(),
                input: Bytes::from_static(b"ping"),
                timeout_ms: 2_000,
                ..pb::DispatchRequest::default()
            })
            .await
            .ok()?
            .into_inner();
        let completed = matches!(
            reply.outcome.and_then(|o| o.outcome),
            Some(pb::dispatch_outcome::Outcome::Completed(done)) if done.output == Bytes::from_static(b"ping")
        );
        if !completed {
            return None;
        }
    }
    Some(ids)
}

/// The fleet of the scenario: a CLI worker process and an SDK worker task.
struct Fleet {
    cli: Process,
    sdk: tokio::task::JoinHandle<Result<(), switchyard_transport_grpc::WorkerError>>,
    sdk_stop: tokio_util::sync::CancellationToken,
}

async fn fleet(port: u16, data_dir: &Path) -> Fleet {
    let mut cli = Process::spawn(
        Command::new(switchyard())
            .args(["worker", "--transport", "grpc"])
            .arg("--activity")
            .arg(format!("{CLI_ACTIVITY}=echo"))
            .arg("--endpoint")
            .arg(format!("https://127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data_dir)
            .env_remove("SWITCHYARD_TOKEN")
            .env_remove("RUST_LOG"),
    );
    cli.line_containing("connected over grpc").await;
    let worker = GrpcWorker::builder(format!("https://localhost:{port}"))
        .namespaces(["default"])
        .activity(SDK_ACTIVITY, echo)
        .tls(client_tls(data_dir))
        .backoff(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
        })
        .connect()
        .await
        .expect("the SDK worker registers");
    let sdk_stop = worker.shutdown_token();
    let sdk = tokio::spawn(worker.run());
    Fleet { cli, sdk, sdk_stop }
}

/// Runs the scenario, ending the first gateway with `end` (SIGTERM or SIGKILL).
async fn restart_and_expect_the_fleet_back(end: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let port = free_port();
    let config = write_config(dir.path(), port, &data_dir);

    let (mut first, _) = serve(&config).await;
    let mut fleet = fleet(port, &data_dir).await;
    both_serving(port, &data_dir, UNIX_EPOCH, Instant::now() + PATIENCE).await;

    first.signal(end);
    let status = first.exit().await;
    if end == "TERM" {
        assert!(
            status.success(),
            "the gateway stops cleanly on SIGTERM: {status:?}"
        );
    }
    // Control: nothing is registered anywhere between the two gateways.
    assert!(
        producer(port, &data_dir).await.is_none(),
        "the old gateway is gone"
    );
    assert!(!fleet.sdk.is_finished(), "the SDK worker keeps trying");
    assert!(
        fleet.cli.child.try_wait().unwrap().is_none(),
        "the CLI worker keeps trying; stderr: {:?}",
        fleet.cli.stderr.lock().unwrap()
    );

    let restarted_at = SystemTime::now();
    let (_second, ready) = serve(&config).await;
    let ids = both_serving(port, &data_dir, restarted_at, ready + BACK_WITHIN).await;
    assert_eq!(ids.len(), 2);

    assert!(
        fleet.cli.stderr_contains("lost the gateway"),
        "the CLI says it lost the gateway; stderr: {:?}",
        fleet.cli.stderr.lock().unwrap()
    );
    assert!(
        fleet.cli.stderr_contains("reconnecting"),
        "the CLI says it is reconnecting"
    );
    // Ctrl-C (SIGINT) is the worker's own final stop: exit 0.
    fleet.cli.signal("INT");
    let cli = fleet.cli.exit().await;
    assert!(cli.success(), "the CLI worker exits 0 on Ctrl-C: {cli:?}");
    fleet.sdk_stop.cancel();
    tokio::time::timeout(PATIENCE, &mut fleet.sdk)
        .await
        .expect("the SDK worker stops")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_and_a_restart_grpc_workers_return_and_serve() {
    restart_and_expect_the_fleet_back("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_and_a_restart_grpc_workers_return_and_serve() {
    restart_and_expect_the_fleet_back("KILL").await;
}
