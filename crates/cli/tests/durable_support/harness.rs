//! What the durable end-to-end tests share: the real `switchyard serve` process on a fixed
//! loopback port and data directory (so a restart finds both again), a producer client over
//! the wire, and SDK workers in the test process whose handlers count, per input tag, how often
//! they ran.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::gateway_client::GatewayClient;
use switchyard_transport_grpc::{ActivityContext, ActivityError, Backoff, GrpcWorker};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Upper bound on any one wait for the gateway or a worker.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The namespace every durable test dispatches in.
pub const NAMESPACE: &str = "default";

/// The `switchyard` binary cargo built for this test.
pub fn switchyard() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_switchyard"))
}

/// Whether the long variants run (`SWITCHYARD_LONG_TESTS=1`).
pub fn long_tests() -> bool {
    std::env::var("SWITCHYARD_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A process killed on drop, its output lines collected as they come.
pub struct Process {
    child: Child,
    stdout: mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    /// Reads stderr until the process closes it.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

/// How many of a process's last stderr (and unread stdout) lines a failing test prints.
const OUTPUT_TAIL: usize = 200;

/// Prints the last [`OUTPUT_TAIL`] of `lines`, headed by what they are.
fn print_tail(what: &str, lines: &[String]) {
    let skip = lines.len().saturating_sub(OUTPUT_TAIL);
    eprintln!(
        "--- {what}: last {} of {} lines ---",
        lines.len() - skip,
        lines.len()
    );
    for line in &lines[skip..] {
        eprintln!("{line}");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what each of its processes logged: a failure seen once on a
        // loaded machine is then read from the test's own output, not guessed at.
        if std::thread::panicking() {
            if let Some(reader) = self.stderr_reader.take() {
                let _ = reader.join();
            }
            let pid = self.child.id();
            let stderr = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
            print_tail(&format!("process {pid} stderr"), &stderr);
            let mut unread = Vec::new();
            while let Ok(line) = self.stdout.try_recv() {
                unread.push(line);
            }
            print_tail(
                &format!("process {pid} stdout the test did not read"),
                &unread,
            );
        }
    }
}

impl Process {
    /// Starts `command` with its output piped.
    pub fn spawn(command: &mut Command) -> Self {
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
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        Self {
            child,
            stdout,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout line containing `needle`.
    pub async fn line_containing(&mut self, needle: &str) -> String {
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

    /// Waits for a stdout line containing `needle`; `None` when the process closes its
    /// stdout first (it exited, say refusing to start).
    pub async fn line_or_exit(&mut self, needle: &str) -> Option<String> {
        tokio::time::timeout(PATIENCE, async {
            while let Some(line) = self.stdout.recv().await {
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await
        .expect("the process prints or exits within the patience")
    }

    /// Everything it wrote on stderr so far, one string.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// SIGKILL, then reaps it: no drain, no goodbye, the store file left as it was.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("SIGKILL is sent");
        self.child.wait().expect("the killed gateway is reaped");
    }

    /// SIGTERM, then waits for it to exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.exit().await
    }

    /// Sends it `signal` (a name `kill` knows: `TERM`, `KILL`, `INT`), without waiting.
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} failed");
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit, polling (a `Child` has no async wait), and for the
    /// last of its stderr to be read.
    pub async fn exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                if let Some(reader) = self.stderr_reader.take() {
                    tokio::task::spawn_blocking(move || reader.join())
                        .await
                        .unwrap()
                        .unwrap();
                }
                return status;
            }
            assert!(Instant::now() < deadline, "the process did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A gateway's files: its configuration (fixed port, data directory, store) in a temporary
/// directory that outlives every restart of the test.
pub struct Site {
    /// Holds the files; removed on drop.
    pub dir: tempfile::TempDir,
    /// The gateway's data directory (TLS material and the store).
    pub data_dir: PathBuf,
    /// The gRPC (worker and producer API) port, the same for every restart.
    pub port: u16,
    /// The configuration file.
    pub config: PathBuf,
}

impl Site {
    /// A site with the SQLite store (the default backend) in its data directory.
    pub fn new() -> Self {
        Self::with_store("")
    }

    /// A site whose `[store]` table holds `store` (TOML lines).
    pub fn with_store(store: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let port = free_port();
        let config = dir.path().join("switchyard.toml");
        write_config(&config, port, &data_dir, store);
        Self {
            dir,
            data_dir,
            port,
            config,
        }
    }

    /// Another configuration on the same data directory, listening on `port`.
    pub fn sibling_config(&self, port: u16) -> PathBuf {
        let config = self.dir.path().join(format!("switchyard-{port}.toml"));
        write_config(&config, port, &self.data_dir, "");
        config
    }

    /// The store file (the default `store.path`).
    pub fn store_file(&self) -> PathBuf {
        self.data_dir.join("dispatches.sqlite3")
    }

    /// Starts `switchyard serve` and waits for its banner.
    pub async fn serve(&self) -> Process {
        let mut gateway = serve_command(&self.config);
        gateway.line_containing("grpc").await;
        gateway
    }

    /// A producer connected to the gateway; `None` while nothing listens.
    pub async fn producer(&self) -> Option<Producer> {
        let ca = std::fs::read_to_string(self.data_dir.join("tls").join("ca.pem")).ok()?;
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", self.port))
            .unwrap()
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .domain_name("localhost"),
            )
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .ok()?;
        Some(Producer(GatewayClient::new(channel)))
    }

    /// A TLS client configuration trusting the gateway's development CA.
    pub fn client_tls(&self) -> ClientTlsConfig {
        let ca = std::fs::read_to_string(self.data_dir.join("tls").join("ca.pem")).unwrap();
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost")
    }
}

/// Spawns `switchyard serve --config CONFIG` without waiting for anything. The gateway reads
/// `SWITCHYARD_*` variables as configuration (and refuses unknown ones, such as the test
/// switch `SWITCHYARD_LONG_TESTS`): it gets none of the test's.
pub fn serve_command(config: &Path) -> Process {
    let mut command = Command::new(switchyard());
    command
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SWITCHYARD_") {
            command.env_remove(name);
        }
    }
    Process::spawn(&mut command)
}

fn write_config(path: &Path, port: u16, data_dir: &Path, store: &str) {
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

[store]
{store}
"#,
        data_dir.display()
    );
    std::fs::write(path, config).unwrap();
}

/// The input of the dispatch tagged `tag`: the tag, little endian.
pub fn tagged(tag: u64) -> Bytes {
    Bytes::copy_from_slice(&tag.to_le_bytes())
}

/// The tag of a [`tagged`] input.
pub fn tag_of(input: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(input.get(..8)?.try_into().ok()?))
}

/// One handler run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The attempt number the gateway sent.
    pub attempt: u32,
}

/// Every handler run of every worker, by input tag.
#[derive(Debug, Default)]
pub struct Ledger {
    runs: Mutex<HashMap<u64, Vec<Run>>>,
    recorded: tokio::sync::Notify,
}

impl Ledger {
    fn record(&self, tag: u64, run: Run) {
        self.runs.lock().unwrap().entry(tag).or_default().push(run);
        self.recorded.notify_waiters();
    }

    /// Waits (unbounded: wrap it in a timeout) until the handlers have run `runs` times in all.
    pub async fn wait_total(&self, runs: usize) {
        loop {
            let recorded = self.recorded.notified();
            tokio::pin!(recorded);
            // Armed before the check, so a run recorded in between is not missed.
            recorded.as_mut().enable();
            if self.total() >= runs {
                return;
            }
            recorded.await;
        }
    }

    /// How often the handlers ran `tag`.
    pub fn executions(&self, tag: u64) -> usize {
        self.runs.lock().unwrap().get(&tag).map_or(0, Vec::len)
    }

    /// The runs of `tag`, in the order they started.
    pub fn runs(&self, tag: u64) -> Vec<Run> {
        self.runs
            .lock()
            .unwrap()
            .get(&tag)
            .cloned()
            .unwrap_or_default()
    }

    /// Every tag that started at least once.
    pub fn started(&self) -> Vec<u64> {
        self.runs.lock().unwrap().keys().copied().collect()
    }

    /// Handler runs in all.
    pub fn total(&self) -> usize {
        self.runs.lock().unwrap().values().map(Vec::len).sum()
    }
}

/// A worker in this process; reconnects by itself after the gateway goes away.
pub struct TestWorker {
    stop: CancellationToken,
    registrations: watch::Receiver<Option<switchyard_core::WorkerId>>,
    run: tokio::task::JoinHandle<()>,
}

impl TestWorker {
    /// Connects a worker of `activity` with `capacity`, whose handler records each run in
    /// `ledger` and then takes `service_time(tag)` before echoing its input.
    pub async fn connect(
        site: &Site,
        activity: &str,
        capacity: u32,
        ledger: Arc<Ledger>,
        service_time: fn(u64) -> Duration,
    ) -> Self {
        let worker = GrpcWorker::builder(format!("https://localhost:{}", site.port))
            .namespaces([NAMESPACE])
            .max_concurrency(capacity)
            .tls(site.client_tls())
            .backoff(Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(200),
            })
            .activity(activity, move |ctx: ActivityContext, input: Bytes| {
                let ledger = Arc::clone(&ledger);
                async move {
                    let tag =
                        tag_of(&input).ok_or_else(|| ActivityError::fatal("untagged input"))?;
                    ledger.record(
                        tag,
                        Run {
                            attempt: ctx.attempt(),
                        },
                    );
                    tokio::time::sleep(service_time(tag)).await;
                    Ok(input)
                }
            })
            .connect()
            .await
            .expect("the worker registers");
        let handle = worker.handle();
        let stop = worker.shutdown_token();
        let run = tokio::spawn(async move {
            let _ = worker.run().await;
        });
        Self {
            stop,
            registrations: handle.registrations(),
            run,
        }
    }

    /// Waits until the worker has seen its connection end (after a gateway kill): from then
    /// on no task of the lost connection can start in its handlers.
    pub async fn lost(&mut self) {
        tokio::time::timeout(PATIENCE, self.registrations.wait_for(Option::is_none))
            .await
            .expect("the worker notices the gateway is gone")
            .expect("the worker is still running");
    }

    /// Stops the worker.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(PATIENCE, self.run).await;
    }
}

/// A durable dispatch as the producer got it back from `Submit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The dispatch id.
    pub id: String,
    /// True when the idempotency key was already known.
    pub existing: bool,
}

/// The producer side of the durable API, one call per method.
#[derive(Clone)]
pub struct Producer(pub GatewayClient<Channel>);

impl Producer {
    /// `Submit`: a durable dispatch of `activity` with input [`tagged`]`(tag)`.
    pub async fn submit(
        &mut self,
        activity: &str,
        tag: u64,
        key: Option<String>,
        timeout: Duration,
    ) -> Result<Submitted, tonic::Status> {
        let reply = self
            .0
            .submit(pb::DispatchRequest {
                namespace: NAMESPACE.into(),
                activity_type: activity.into(),
                input: tagged(tag),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap(),
                durable: Some(true),
                idempotency_key: key.unwrap_or_default(),
                ..pb::DispatchRequest::default()
            })
            .await?
            .into_inner();
        Ok(Submitted {
            id: reply.dispatch_id,
            existing: reply.existing,
        })
    }

    /// `AwaitOutcome`: the outcome, or `None` if not finished within `wait`.
    pub async fn await_outcome(
        &mut self,
        id: &str,
        wait: Duration,
    ) -> Result<Option<pb::DispatchOutcome>, tonic::Status> {
        let reply = self
            .0
            .await_outcome(pb::AwaitOutcomeRequest {
                dispatch_id: id.to_owned(),
                wait_ms: u64::try_from(wait.as_millis()).unwrap(),
            })
            .await?
            .into_inner();
        Ok(match reply.result {
            Some(pb::await_outcome_reply::Result::Outcome(outcome)) => Some(outcome),
            Some(pb::await_outcome_reply::Result::Pending(_)) | None => None,
        })
    }

    /// `GetDispatch`: the dispatch as the gateway reports it.
    pub async fn get(&mut self, id: &str) -> Result<pb::DispatchInfo, tonic::Status> {
        self.0
            .get_dispatch(pb::GetDispatchRequest {
                dispatch_id: id.to_owned(),
            })
            .await?
            .into_inner()
            .dispatch
            .ok_or_else(|| tonic::Status::internal("GetDispatch without a dispatch"))
    }
}

/// The output of a completed outcome, `None` for any other outcome.
pub fn completed_output(outcome: &pb::DispatchOutcome) -> Option<&Bytes> {
    match &outcome.outcome {
        Some(pb::dispatch_outcome::Outcome::Completed(done)) => Some(&done.output),
        _ => None,
    }
}
