//! The Rust worker SDK: register activity handlers, connect, run.
//!
//! A [`GrpcWorker`] holds one registered stream at a time. Its runtime answers the gateway's
//! pings itself, runs at most `max_concurrency` handlers at once, fires a handler's
//! cancellation token on `CancelActivity`, and finishes in-flight work and closes on
//! `DrainRequest`. A drain the gateway sends because it is shutting down, or a lost stream,
//! is not the end: the worker reconnects with jittered exponential backoff and registers again
//! (under a new worker id; the gateway re-dispatches what the old one held). Only a requested
//! drain, or the embedder's shutdown token, ends [`GrpcWorker::run`].

mod link;
mod runtime;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::WorkerId;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tracing::Instrument;

pub use link::ConnectError;
pub use switchyard_core::Backoff;

use link::Link;
use runtime::SessionEnd;
use switchyard_core::ActivityHandler;

/// Room in the outbound queue beyond one result per task, for pongs and cancel acks.
const OUTBOUND_HEADROOM: usize = 16;

/// A connected, registered worker; call [`GrpcWorker::run`] to serve tasks.
///
/// # Examples
///
/// ```no_run
/// use bytes::Bytes;
/// use switchyard_transport_grpc::{ActivityContext, ActivityError, GrpcWorker};
/// use tonic::transport::{Certificate, ClientTlsConfig};
///
/// async fn resize(ctx: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
///     if ctx.is_cancelled() {
///         return Err(ActivityError::retryable("cancelled before start"));
///     }
///     Ok(input)
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let ca = Certificate::from_pem(std::fs::read("ca.pem")?);
/// let worker = GrpcWorker::builder("https://gateway.example:7233")
///     .namespaces(["media"])
///     .task_queue("images")
///     .node("rack-4")
///     .activity("resize", resize)
///     .max_concurrency(8)
///     .tls(ClientTlsConfig::new().ca_certificate(ca))
///     .token("s3cret")
///     .connect()
///     .await?;
/// println!("registered as worker {}", worker.worker_id());
/// worker.run().await?;
/// # Ok(())
/// # }
/// ```
pub struct GrpcWorker {
    settings: Arc<WorkerSettings>,
    endpoint: Endpoint,
    link: Option<Link>,
    worker_id: WorkerId,
    task_queue: String,
    permits: Arc<Semaphore>,
    stop: CancellationToken,
}

impl std::fmt::Debug for GrpcWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcWorker")
            .field("endpoint", &self.settings.endpoint)
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

impl GrpcWorker {
    /// Starts configuring a worker for the gateway at `endpoint` (`http://` or `https://`).
    pub fn builder(endpoint: impl Into<String>) -> GrpcWorkerBuilder {
        GrpcWorkerBuilder {
            settings: WorkerSettings {
                endpoint: endpoint.into(),
                namespaces: Vec::new(),
                task_queue: String::new(),
                node: String::new(),
                identity: format!("rust-sdk pid {}", std::process::id()),
                activities: BTreeMap::new(),
                max_concurrency: 16,
                tls: None,
                token: None,
                backoff: Backoff::default(),
                connect_timeout: Duration::from_secs(10),
                keepalive_interval: Duration::from_secs(10),
                keepalive_timeout: Duration::from_secs(20),
                max_message_bytes: 16 * 1024 * 1024,
            },
        }
    }

    /// The id of the first registration (a reconnection registers under a new id).
    pub fn worker_id(&self) -> WorkerId {
        self.worker_id
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        &self.task_queue
    }

    /// A token that stops [`GrpcWorker::run`] when cancelled: in-flight handlers are
    /// cancelled, the stream is dropped (the gateway re-dispatches its tasks) and `run`
    /// returns `Ok`.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Serves tasks until drained for good by the gateway (a requested drain) or stopped
    /// through [`GrpcWorker::shutdown_token`]. After the gateway shuts down or the stream is
    /// lost it reconnects with the configured [`Backoff`], logging (INFO/WARN) what happened
    /// and when it tries again. Fails only when a reconnection is refused for good (see
    /// [`ConnectError::is_permanent`]).
    pub async fn run(mut self) -> Result<(), ConnectError> {
        let mut attempt: u32 = 0;
        loop {
            let link = match self.link.take() {
                Some(link) => link,
                None => {
                    let delay = self.settings.backoff.delay(attempt, &mut rand::rng());
                    attempt = attempt.saturating_add(1);
                    let opened = tokio::select! {
                        () = self.stop.cancelled() => return Ok(()),
                        opened = async {
                            tokio::time::sleep(delay).await;
                            link::open(&self.endpoint, &self.settings).await
                        } => opened,
                    };
                    match opened {
                        Ok(link) => {
                            tracing::info!(worker = link.ack.worker_id, attempt,
                                endpoint = %self.settings.endpoint, "reconnected to the gateway");
                            attempt = 0;
                            link
                        }
                        Err(error) if error.is_permanent() => return Err(error),
                        Err(error) => {
                            let next = self.settings.backoff.ceiling(attempt);
                            tracing::warn!(%error, attempt, retry_within = ?next,
                                "reconnection failed; retrying");
                            continue;
                        }
                    }
                }
            };
            let span = tracing::info_span!("switchyard_worker", worker = link.ack.worker_id);
            let served = runtime::serve(link, &self.settings, &self.permits, &self.stop)
                .instrument(span)
                .await;
            let ceiling = self.settings.backoff.ceiling(attempt);
            match served {
                SessionEnd::Drained | SessionEnd::Stopped => return Ok(()),
                SessionEnd::ShuttingDown => {
                    tracing::warn!(endpoint = %self.settings.endpoint, retry_within = ?ceiling,
                        "lost the gateway: it is shutting down; reconnecting");
                }
                SessionEnd::Lost(reason) => {
                    tracing::warn!(endpoint = %self.settings.endpoint, %reason,
                        retry_within = ?ceiling, "lost the gateway; reconnecting");
                }
            }
        }
    }
}

/// Configures a [`GrpcWorker`]; see [`GrpcWorker::builder`].
pub struct GrpcWorkerBuilder {
    settings: WorkerSettings,
}

impl std::fmt::Debug for GrpcWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcWorkerBuilder")
            .field("endpoint", &self.settings.endpoint)
            .finish_non_exhaustive()
    }
}

impl GrpcWorkerBuilder {
    /// Adds namespaces to serve (at least one is required).
    pub fn namespaces<I, S>(mut self, namespaces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.settings
            .namespaces
            .extend(namespaces.into_iter().map(Into::into));
        self
    }

    /// The task queue to serve in each namespace (default: the gateway's default queue).
    pub fn task_queue(mut self, task_queue: impl Into<String>) -> Self {
        self.settings.task_queue = task_queue.into();
        self
    }

    /// The locality label to advertise (default: none).
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.settings.node = node.into();
        self
    }

    /// The free-form process description operators see (default: `rust-sdk pid <pid>`).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.settings.identity = identity.into();
        self
    }

    /// Serves activity type `name` with `handler` (at least one is required); a later handler
    /// for the same name replaces the earlier one.
    pub fn activity(mut self, name: impl Into<String>, handler: impl ActivityHandler) -> Self {
        self.settings
            .activities
            .insert(name.into(), Arc::new(handler));
        self
    }

    /// Most handlers running at once, and the capacity advertised to the gateway (default 16).
    pub fn max_concurrency(mut self, max_concurrency: u32) -> Self {
        self.settings.max_concurrency = max_concurrency;
        self
    }

    /// TLS settings (CA to trust, client identity for mTLS); the endpoint must be `https://`.
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.settings.tls = Some(tls);
        self
    }

    /// A bearer token sent as `authorization: Bearer <token>`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.settings.token = Some(token.into());
        self
    }

    /// Waits between reconnection attempts (default: 100 ms doubling to 30 s, jittered).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = backoff;
        self
    }

    /// HTTP/2 keepalive: PING interval and how long an unanswered one may wait before the
    /// connection counts as lost (default 10 s and 20 s).
    pub fn keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.settings.keepalive_interval = interval;
        self.settings.keepalive_timeout = timeout;
        self
    }

    /// Longest wait for the TCP and TLS handshake (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Largest message sent or accepted, in bytes (default 16 MiB).
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_message_bytes = bytes;
        self
    }

    /// Connects, registers, and waits for the gateway's acknowledgement; no retry here.
    pub async fn connect(self) -> Result<GrpcWorker, ConnectError> {
        let settings = Arc::new(self.settings);
        let endpoint = link::endpoint(&settings)?;
        let link = link::open(&endpoint, &settings).await?;
        let worker_id = WorkerId::from_raw(link.ack.worker_id);
        let task_queue = link.ack.task_queue.clone();
        let permits = usize::try_from(settings.max_concurrency)
            .unwrap_or(Semaphore::MAX_PERMITS)
            .min(Semaphore::MAX_PERMITS);
        Ok(GrpcWorker {
            endpoint,
            link: Some(link),
            worker_id,
            task_queue,
            permits: Arc::new(Semaphore::new(permits)),
            stop: CancellationToken::new(),
            settings,
        })
    }
}

/// Everything a worker was configured with.
pub(crate) struct WorkerSettings {
    pub(crate) endpoint: String,
    pub(crate) namespaces: Vec<String>,
    pub(crate) task_queue: String,
    pub(crate) node: String,
    pub(crate) identity: String,
    pub(crate) activities: BTreeMap<String, Arc<dyn ActivityHandler>>,
    pub(crate) max_concurrency: u32,
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) token: Option<String>,
    pub(crate) backoff: Backoff,
    pub(crate) connect_timeout: Duration,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    pub(crate) max_message_bytes: usize,
}

impl WorkerSettings {
    /// One result per task it may hold, plus room for pongs and cancel acks.
    pub(crate) fn outbound_queue(&self) -> usize {
        usize::try_from(self.max_concurrency)
            .unwrap_or(usize::MAX)
            .min(65_536)
            .saturating_add(OUTBOUND_HEADROOM)
    }
}
