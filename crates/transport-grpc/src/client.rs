//! The Rust worker SDK over gRPC: a thin [`Link`] on the shared worker runtime.
//!
//! A [`GrpcWorker`] holds one registered stream at a time. The runtime
//! ([`switchyard_worker`]) validates the options, runs at most `max_concurrency` handlers at
//! once, and reconnects with jittered exponential backoff after the gateway shuts down or the
//! stream is lost. By default the worker registers `resumable`: after a lost stream it resumes
//! its session within the gateway's grace (same worker id; running tasks keep running and
//! results the gateway never acknowledged are sent again), else registers again under a new
//! worker id and the gateway re-dispatches what the old one held. This link answers pings,
//! fires a handler's cancellation token on `CancelActivity`, forgets acknowledged results on
//! `ResultsAck`, and finishes in-flight work and closes on `DrainRequest`. Only a requested
//! drain, or the worker's shutdown, ends [`GrpcWorker::run`].
//!
//! [`WorkerHandle::drain`] sends `WorkerDrainRequest` (the gateway answers with a requested
//! drain, final) and [`WorkerHandle::set_max_concurrency`] sends `CapacityUpdate` (also after a
//! reconnection, when the capacity differs from the options); a capacity the gateway's gate
//! refuses ends the stream with its status and `run` returns the permanent error.

mod link;
mod runtime;

use std::time::Duration;

use switchyard_core::{ResumeRequest, WorkerId};
use switchyard_worker::{ConnectionContext, ConnectionEnd, Link, Registered, Worker};
use tokio_util::sync::CancellationToken;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tracing::Instrument;

pub use link::GrpcLinkError;
pub use switchyard_core::Backoff;
pub use switchyard_worker::{WorkerError, WorkerHandle, WorkerOptions};

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
#[derive(Debug)]
pub struct GrpcWorker {
    worker: Worker<GrpcLink>,
}

impl GrpcWorker {
    /// Starts configuring a worker for the gateway at `endpoint` (`http://` or `https://`).
    pub fn builder(endpoint: impl Into<String>) -> GrpcWorkerBuilder {
        GrpcWorkerBuilder {
            options: WorkerOptions::default(),
            settings: DialConfig {
                endpoint: endpoint.into(),
                tls: None,
                keepalive_interval: Duration::from_secs(10),
                keepalive_timeout: Duration::from_secs(20),
                max_message_bytes: 16 * 1024 * 1024,
                inline_handlers: false,
            },
        }
    }

    /// The id of the first registration (a reconnection registers under a new id).
    pub fn worker_id(&self) -> WorkerId {
        self.worker.worker_id()
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        self.worker.task_queue()
    }

    /// A handle to stop or observe the worker while it runs (drain and resize are
    /// unsupported over gRPC).
    pub fn handle(&self) -> WorkerHandle {
        self.worker.handle()
    }

    /// A token that stops [`GrpcWorker::run`] when cancelled: in-flight handlers are
    /// dropped, the stream is closed (the gateway re-dispatches its tasks, after its reconnect
    /// grace when the worker had a session) and `run` returns `Ok`.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.worker.handle().shutdown_token()
    }

    /// Serves tasks until drained for good by the gateway (a requested drain) or stopped
    /// through [`GrpcWorker::shutdown_token`]. After the gateway shuts down or the stream is
    /// lost it reconnects with the configured [`Backoff`], logging (INFO/WARN) what happened
    /// and when it tries again. Fails only when a reconnection is refused for good (see
    /// [`WorkerError::is_permanent`]).
    pub async fn run(self) -> Result<(), WorkerError> {
        self.worker.run().await
    }
}

/// Configures a [`GrpcWorker`]; see [`GrpcWorker::builder`].
pub struct GrpcWorkerBuilder {
    options: WorkerOptions,
    settings: DialConfig,
}

impl std::fmt::Debug for GrpcWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcWorkerBuilder")
            .field("endpoint", &self.settings.endpoint)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl GrpcWorkerBuilder {
    switchyard_worker::worker_option_setters!(reconnect);

    /// TLS settings (CA to trust, client identity for mTLS); the endpoint must be `https://`.
    pub fn tls(mut self, tls: ClientTlsConfig) -> Self {
        self.settings.tls = Some(tls);
        self
    }

    /// HTTP/2 keepalive: PING interval and how long an unanswered one may wait before the
    /// connection counts as lost (default 10 s and 20 s).
    pub fn keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.settings.keepalive_interval = interval;
        self.settings.keepalive_timeout = timeout;
        self
    }

    /// Largest message sent or accepted, in bytes (default 16 MiB).
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_message_bytes = bytes;
        self
    }

    /// Runs each handler on the stream's reader up to its first wait, instead of on a runtime
    /// task of its own from the start (default off). A handler that answers at once (an echo,
    /// a cached answer) then costs no task and no wake-up of its own; one that waits moves onto
    /// a task of its own at its first wait. Only for handlers that do no long synchronous work
    /// before their first `.await`: until then the reader reads no other frame (no task, no
    /// ping, no cancel), and a reader held past the gateway's ping timeout makes the worker
    /// unreachable to it.
    pub fn inline_handlers(mut self, on: bool) -> Self {
        self.settings.inline_handlers = on;
        self
    }

    /// Validates, connects, registers, and waits for the gateway's acknowledgement; no retry
    /// here.
    pub async fn connect(self) -> Result<GrpcWorker, WorkerError> {
        self.options.validate()?;
        let endpoint = link::endpoint(&self.settings, self.options.connect_timeout)
            .map_err(|error| WorkerError::link(GrpcLink::TRANSPORT, error))?;
        let link = GrpcLink {
            endpoint,
            settings: self.settings,
        };
        let worker = Worker::connect(link, self.options).await?;
        Ok(GrpcWorker { worker })
    }
}

/// The gRPC-specific settings of a worker.
pub(crate) struct DialConfig {
    pub(crate) endpoint: String,
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    pub(crate) max_message_bytes: usize,
    /// Whether a handler runs on the stream's reader up to its first wait.
    pub(crate) inline_handlers: bool,
}

/// The gRPC worker link: one `ConnectWorker` stream per connection.
pub(crate) struct GrpcLink {
    endpoint: Endpoint,
    settings: DialConfig,
}

impl Link for GrpcLink {
    type Connection = link::Stream;
    type Error = GrpcLinkError;
    const TRANSPORT: &'static str = "grpc";
    const CAN_DRAIN: bool = true;
    const CAN_RESIZE: bool = true;

    async fn open(
        &self,
        options: &WorkerOptions,
        resume: Option<&ResumeRequest>,
    ) -> Result<(link::Stream, Registered), GrpcLinkError> {
        link::open(&self.endpoint, &self.settings, options, resume).await
    }

    async fn serve(
        &self,
        stream: link::Stream,
        context: ConnectionContext<'_>,
    ) -> ConnectionEnd<GrpcLinkError> {
        let span = tracing::info_span!("switchyard_worker", worker = stream.ack.worker_id);
        runtime::serve(stream, &self.settings, context)
            .instrument(span)
            .await
    }
}
