//! A tiny Rust worker over the WebSocket protocol: register handlers, connect, run.
//!
//! A [`WsWorker`] holds one registered socket. Its options and validation
//! ([`WorkerOptions`]) and its task runner ([`TaskRunner`]: at most `max_concurrency` handlers
//! at once, cancellation, panic catching, result or cancel-ack) are the shared worker
//! runtime's (`switchyard-worker`); this client adds the socket: it answers the gateway's
//! pings, fires a handler's cancellation on `cancel`, and on `drain` finishes in-flight work,
//! then closes with 1000. It does not reconnect: [`WsWorker::run`] returns when the
//! socket ends, and a caller that wants to stay connected builds a new worker in a loop (the
//! gateway hands the old one's tasks to other workers in the meantime).

mod dial;
mod error;
mod runtime;

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::WorkerId;
use switchyard_worker::{TaskRunner, WorkerOptions};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use error::{RunError, WsLinkError};
pub use switchyard_core::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};

use dial::RegisteredSocket;

/// Room in the outbound queue beyond one result per task, for pongs and cancel acks.
const OUTBOUND_HEADROOM: usize = 16;

/// A connected, registered worker; call [`WsWorker::run`] to serve tasks.
///
/// # Examples
///
/// ```no_run
/// use bytes::Bytes;
/// use switchyard_transport_websocket::{ActivityContext, ActivityError, WsWorker};
///
/// async fn shout(ctx: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
///     if ctx.is_cancelled() {
///         return Err(ActivityError::retryable("cancelled before start"));
///     }
///     Ok(Bytes::from(input.to_ascii_uppercase()))
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let worker = WsWorker::builder("wss://gateway.example:7443/")
///     .namespaces(["media"])
///     .task_queue("text")
///     .activity("shout", shout)
///     .max_concurrency(8)
///     .token("s3cret")
///     .connect()
///     .await?;
/// println!("registered as worker {}", worker.worker_id());
/// worker.run().await?;
/// # Ok(())
/// # }
/// ```
pub struct WsWorker {
    settings: Arc<DialConfig>,
    socket: RegisteredSocket,
    runner: TaskRunner,
    outbound_queue: usize,
    stop: CancellationToken,
}

impl std::fmt::Debug for WsWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsWorker")
            .field("url", &self.settings.url)
            .field("worker_id", &self.socket.worker_id)
            .finish_non_exhaustive()
    }
}

impl WsWorker {
    /// Starts configuring a worker for the gateway at `url` (`ws://` or `wss://`).
    pub fn builder(url: impl Into<String>) -> WsWorkerBuilder {
        WsWorkerBuilder {
            options: WorkerOptions {
                identity: format!("rust-ws pid {}", std::process::id()),
                ..WorkerOptions::default()
            },
            settings: DialConfig {
                url: url.into(),
                tls: None,
                close_timeout: Duration::from_secs(5),
                max_message_bytes: 16 * 1024 * 1024,
            },
        }
    }

    /// The id the gateway gave this worker.
    pub fn worker_id(&self) -> WorkerId {
        self.socket.worker_id
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        &self.socket.task_queue
    }

    /// How often the gateway said it will ping.
    pub fn ping_interval(&self) -> Duration {
        self.socket.ping_interval
    }

    /// A token that stops [`WsWorker::run`] when cancelled: in-flight handlers are cancelled,
    /// the socket closes with 1001 (the gateway hands their tasks to other workers) and `run`
    /// returns `Ok`.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Serves tasks until the gateway's drain is finished (the worker closed after its last
    /// result, or the gateway closed once nothing was left) or the worker is stopped through
    /// [`WsWorker::shutdown_token`], both `Ok`; or until the socket ends otherwise.
    pub async fn run(self) -> Result<(), RunError> {
        let span = tracing::info_span!("ws_worker", worker = %self.socket.worker_id);
        runtime::serve(
            self.socket,
            &self.settings,
            &self.runner,
            self.outbound_queue,
            &self.stop,
        )
        .instrument(span)
        .await
    }
}

/// Configures a [`WsWorker`]; see [`WsWorker::builder`].
pub struct WsWorkerBuilder {
    options: WorkerOptions,
    settings: DialConfig,
}

impl std::fmt::Debug for WsWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsWorkerBuilder")
            .field("url", &self.settings.url)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl WsWorkerBuilder {
    switchyard_worker::worker_option_setters!();

    /// TLS settings for `wss://` (default: the public web's roots, from `webpki-roots`).
    pub fn tls(mut self, tls: Arc<rustls::ClientConfig>) -> Self {
        self.settings.tls = Some(tls);
        self
    }

    /// Longest wait for TCP, TLS, the upgrade and the registration answer together
    /// (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.options.connect_timeout = timeout;
        self
    }

    /// Largest WebSocket message accepted from the gateway, in bytes (default 16 MiB).
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_message_bytes = bytes;
        self
    }

    /// Validates the options, connects, registers, and waits for the gateway's answer.
    pub async fn connect(self) -> Result<WsWorker, WsLinkError> {
        self.options.validate()?;
        let socket = dial::open(&self.settings, &self.options).await?;
        let runner = TaskRunner::new(
            self.options.activities.clone(),
            self.options.max_concurrency,
        );
        Ok(WsWorker {
            socket,
            runner,
            stop: CancellationToken::new(),
            outbound_queue: outbound_queue(self.options.max_concurrency),
            settings: Arc::new(self.settings),
        })
    }
}

/// The WebSocket-specific settings of a worker.
pub(crate) struct DialConfig {
    pub(crate) url: String,
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) close_timeout: Duration,
    pub(crate) max_message_bytes: usize,
}

/// One result per task it may hold, plus room for pongs and cancel acks.
fn outbound_queue(max_concurrency: u32) -> usize {
    usize::try_from(max_concurrency)
        .unwrap_or(usize::MAX)
        .min(65_536)
        .saturating_add(OUTBOUND_HEADROOM)
}
