//! The Python SDK's worker passes core's conformance kit: the gRPC transport over the kit's
//! core, TLS on loopback, and each kit worker a `sdk/python/tests/conformance_worker.py`
//! process dialling through its own [`TcpRelay`] (so the kit can sever, freeze or break its
//! link below the SDK). The kit's handler runs here: the Python worker forwards every task over
//! a loopback bridge connection (one JSON line per task, cancel and reply).
//!
//! Ignored by `cargo test --workspace`, which runs before the Python environment exists;
//! `sdk/python/ci.sh` runs it once it has set that up (`--ignored`).
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{Value, json};
use switchyard_auth::CallerTable;
use switchyard_core::testkit::{
    self, BoxError, ConformanceFailures, ConformanceWorker, Handler, HarnessError, TaskCall,
    TransportHarness, WorkerSpec,
};
use switchyard_core::{Core, RefusalKind, TaskResult, WorkerId};
use switchyard_test_support::{PATIENCE, TcpRelay, TestCa};
use switchyard_transport_grpc::{GrpcServerConfig, WorkerService, serve};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Identity, ServerTlsConfig};

/// The bearer token the gateway maps to the kit's `index`th caller.
fn token(index: usize) -> String {
    format!("conformance-caller-{index}")
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `$PYSDK_PYTHON`, else the virtual environment `sdk/python/ci.sh` makes.
fn python() -> PathBuf {
    std::env::var_os("PYSDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/py-venv/bin/python"))
}

struct PythonHarness;

/// The gRPC worker service over the kit's core, with a fresh CA whose certificate the Python
/// workers trust from a file.
struct Gateway {
    addr: SocketAddr,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

#[async_trait]
impl TransportHarness for PythonHarness {
    type Gateway = Gateway;
    type Worker = PythonWorker;

    async fn start(&self, core: Core) -> Result<Gateway, BoxError> {
        let directory = testkit::callers()
            .into_iter()
            .enumerate()
            .fold(CallerTable::new(), |directory, (index, caller)| {
                directory.with_token(token(index), caller)
            });
        let ca = TestCa::new("python conformance ca");
        let server = ca.server();
        let dir = tempfile::tempdir()?;
        let ca_file = ca.write_to(dir.path(), "ca.pem");
        let tls =
            ServerTlsConfig::new().identity(Identity::from_pem(&server.cert_pem, &server.key_pem));
        let service = WorkerService::new(core, Arc::new(directory), GrpcServerConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            serve(listener, Some(tls), service, shutdown).await.unwrap();
        });
        Ok(Gateway {
            addr,
            ca_file,
            _dir: dir,
            stop: Some(stop),
        })
    }

    fn supports_resume(&self) -> bool {
        true
    }

    async fn connect(
        &self,
        gateway: &Gateway,
        spec: WorkerSpec,
    ) -> Result<PythonWorker, HarnessError> {
        let transport = |error: String| HarnessError::Transport(error.into());
        let index = testkit::callers()
            .iter()
            .position(|caller| *caller == spec.caller)
            .ok_or_else(|| transport("caller unknown to the harness".into()))?;
        let relay = TcpRelay::start(gateway.addr)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let bridge = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| transport(e.to_string()))?;
        let registration = spec.registration;
        let wire = json!({
            "namespaces": registration.namespaces,
            "task_queue": registration.task_queue,
            "node": registration.node.map(|n| n.as_str().to_owned()).unwrap_or_default(),
            "identity": registration.identity,
            "activity_types": registration.activity_types,
            "max_concurrency": registration.max_concurrency.unwrap_or(0),
            "resumable": !registration.reconnect_grace.is_zero(),
        });
        let mut child = Command::new(python())
            .arg(repo().join("sdk/python/tests/conformance_worker.py"))
            .arg(relay.addr().to_string())
            .arg(&gateway.ca_file)
            .arg(token(index))
            .arg(bridge.local_addr().unwrap().port().to_string())
            .arg(wire.to_string())
            .env("PYTHONPATH", repo().join("sdk/python/src"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| transport(format!("{}: {e}", python().display())))?;
        let lines = stdout_lines(&mut child);
        let child = Arc::new(Mutex::new(child));
        let worker = PythonWorker {
            id: WorkerId::from_raw(0),
            relay,
            child,
            bridge: None,
        };
        let mut worker = worker;
        let (stream, _) = tokio::time::timeout(PATIENCE, bridge.accept())
            .await
            .map_err(|_| transport("the Python worker never opened its bridge".into()))?
            .map_err(|e| transport(e.to_string()))?;
        worker.bridge = Some(tokio::spawn(serve_bridge(stream, spec.handler)));
        let line = read_line(lines)
            .await
            .ok_or_else(|| transport("the Python worker exited without registering".into()))?;
        if let Some(id) = line.strip_prefix("registered ") {
            let id = id.trim().parse().map_err(|_| transport(line.clone()))?;
            worker.id = WorkerId::from_raw(id);
            return Ok(worker);
        }
        let Some(refusal) = line.strip_prefix("refused ") else {
            return Err(transport(line));
        };
        let (code, message) = refusal.split_once(' ').unwrap_or((refusal, ""));
        let kind = match code {
            "INVALID_ARGUMENT" | "CONFIG" => RefusalKind::Invalid,
            "PERMISSION_DENIED" => RefusalKind::Unauthorised,
            "NOT_FOUND" => RefusalKind::NotFound,
            "FAILED_PRECONDITION" => RefusalKind::Placement,
            _ => return Err(transport(line)),
        };
        Err(HarnessError::Refused {
            kind,
            message: message.to_owned(),
        })
    }
}

/// The child's stdout, one line at a time, read on a thread of its own.
fn stdout_lines(child: &mut Child) -> mpsc::UnboundedReceiver<String> {
    let (sender, lines) = mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    lines
}

async fn read_line(mut lines: mpsc::UnboundedReceiver<String>) -> Option<String> {
    tokio::time::timeout(PATIENCE, lines.recv())
        .await
        .ok()
        .flatten()
}

/// Runs the kit's handler for every task the Python worker forwards, and fires a task's
/// cancellation when the worker forwards a cancel.
async fn serve_bridge(stream: tokio::net::TcpStream, handler: Handler) {
    let (read, mut write) = stream.into_split();
    let (replies, mut outgoing) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        while let Some(reply) = outgoing.recv().await {
            let mut line = reply.to_string().into_bytes();
            line.push(b'\n');
            if write.write_all(&line).await.is_err() {
                return;
            }
        }
    });
    let mut tasks: HashMap<u64, CancellationToken> = HashMap::new();
    let mut lines = AsyncBufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let message: Value = serde_json::from_str(&line).unwrap();
        if let Some(id) = message["cancel"].as_u64() {
            if let Some(cancelled) = tasks.get(&id) {
                cancelled.cancel();
            }
            continue;
        }
        let id = message["task"].as_u64().unwrap();
        let cancelled = CancellationToken::new();
        tasks.insert(id, cancelled.clone());
        let call = TaskCall {
            activity_type: message["type"].as_str().unwrap().to_owned(),
            input: Bytes::from(from_hex(message["input"].as_str().unwrap())),
            cancelled,
        };
        let running = handler.call(call);
        let replies = replies.clone();
        tokio::spawn(async move {
            let reply = match running.await {
                TaskResult::Success(output) => json!({"done": id, "output": to_hex(&output)}),
                TaskResult::Failure { message, retryable } => {
                    json!({"done": id, "failure": message, "retryable": retryable})
                }
            };
            let _ = replies.send(reply);
        });
    }
    writer.abort();
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// A Python worker process behind its relay.
struct PythonWorker {
    id: WorkerId,
    relay: TcpRelay,
    child: Arc<Mutex<Child>>,
    bridge: Option<JoinHandle<()>>,
}

impl PythonWorker {
    fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl ConformanceWorker for PythonWorker {
    fn worker_id(&self) -> WorkerId {
        self.id
    }

    fn sever(&self) {
        // Cut the sockets first so the gateway sees a dead connection, not a goodbye; then end
        // the process so it does not come back under a new id.
        self.relay.sever();
        self.kill();
    }

    fn freeze(&self) {
        self.relay.freeze();
    }

    /// The relay cuts the live sockets and refuses new ones for a moment; the Python runtime
    /// keeps its handlers running and reconnects through it.
    fn break_link(&self) {
        self.relay.blackout(Duration::from_millis(300));
    }
}

impl Drop for PythonWorker {
    fn drop(&mut self) {
        self.kill();
        if let Some(bridge) = self.bridge.take() {
            bridge.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Python SDK's environment; sdk/python/ci.sh runs it with --ignored"]
async fn python_worker_conforms() -> Result<(), ConformanceFailures> {
    testkit::run_conformance(&PythonHarness).await
}
