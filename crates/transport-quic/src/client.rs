//! The Rust worker SDK for the QUIC transport: a thin [`Link`] on the shared worker runtime.
//!
//! The builder takes the same calls with the same meaning as the gRPC SDK's (the options are
//! [`WorkerOptions`]), plus the QUIC ones (TLS, [`ConnectionConfig`], the local socket).
//! [`QuicWorkerBuilder::connect`] makes the first registration, then [`QuicWorker::run`] serves
//! tasks and the runtime ([`switchyard_worker`]) reconnects with jittered backoff until the
//! worker is drained or refused for good. Capacity is announced right after each
//! registration; the worker grants the gateway one lane (stream) per slot, and each lane
//! carries one task at a time, run by the runtime's [`TaskKeeper`](switchyard_worker::TaskKeeper)
//! so that it outlives a lost connection. Pings are answered on the lane they arrive on, a
//! cancel fires the handler's cancellation token, and a drain lets running tasks finish. With
//! a session, the runtime resumes after a lost connection: the gateway puts each task it still
//! holds on a lane (`held`), where its result is sent (again).

mod connection;
mod lane;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::{ConnectionError, Endpoint};
use switchyard_core::WorkerId;
use switchyard_worker::{ConnectionContext, ConnectionEnd, Link, LinkError, Registered, Worker};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use switchyard_core::Backoff;
pub use switchyard_core::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};
pub use switchyard_worker::{WorkerError, WorkerOptions};

use crate::config::{ConfigError, ConnectionConfig};
use crate::protocol::ErrorCode;
use crate::redundancy::{Redundancy, RedundancyCounters, RedundancyStats};
use crate::tls::ClientTls;
use connection::QuicConnection;

/// The worker's default QUIC keep-alive interval: the longest it stays silent when the gateway
/// is.
///
/// While the gateway is up its pings reach the worker more often than this, so no keep-alive
/// is sent; once the gateway is gone, the keep-alive is what draws the stateless reset of a
/// restarted gateway, so the worker notices the restart within seconds instead of at its
/// idle timeout.
pub const WORKER_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Why the QUIC link failed; reported inside [`WorkerError::Link`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuicLinkError {
    /// A link setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The local UDP socket could not be opened.
    #[error("local udp socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The connection could not be started (bad server name, unsupported address).
    #[error("connect: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// The connection failed or was lost.
    #[error("connection: {0}")]
    Connection(ConnectionError),
    /// The gateway closed the connection with a protocol error code.
    #[error("gateway closed the connection with {code}: {reason}")]
    Refused {
        /// The code.
        code: ErrorCode,
        /// The gateway's reason phrase.
        reason: String,
    },
    /// The gateway broke the protocol; this worker closed the connection with `code`.
    #[error("gateway broke the protocol ({code}): {reason}")]
    Protocol {
        /// The code sent.
        code: ErrorCode,
        /// What was wrong.
        reason: String,
    },
}

impl From<ConnectionError> for QuicLinkError {
    fn from(error: ConnectionError) -> Self {
        if let ConnectionError::ApplicationClosed(close) = &error {
            if let Some(code) = ErrorCode::from_value(close.error_code.into_inner()) {
                return Self::Refused {
                    code,
                    reason: String::from_utf8_lossy(&close.reason).into_owned(),
                };
            }
        }
        Self::Connection(error)
    }
}

impl QuicLinkError {
    /// True when the gateway closed the connection because it is shutting down (or, after a
    /// restart, reset it statelessly): it asks the worker to come back.
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            Self::Refused {
                code: ErrorCode::ShuttingDown,
                ..
            } | Self::Connection(ConnectionError::Reset)
        )
    }
}

impl LinkError for QuicLinkError {
    /// Configuration, or a refusal the gateway marks final such as `UNAUTHENTICATED` or
    /// `CAPACITY_REFUSED`.
    fn is_permanent(&self) -> bool {
        match self {
            Self::Config(_) | Self::Connect(_) => true,
            Self::Refused { code, .. } => code.is_final(),
            _ => false,
        }
    }

    /// The gateway closed with `RESUME_REFUSED`: register afresh.
    fn is_resume_refused(&self) -> bool {
        matches!(
            self,
            Self::Refused {
                code: ErrorCode::ResumeRefused,
                ..
            }
        )
    }
}

/// The QUIC-specific settings of a worker.
pub(crate) struct DialConfig {
    addr: SocketAddr,
    server_name: String,
    tls: ClientTls,
    connection: ConnectionConfig,
    /// What the worker asks the gateway for.
    redundancy: Redundancy,
    /// Datagram copies over every connection of this worker.
    copies: Arc<RedundancyCounters>,
}

/// The QUIC worker link: one lane per slot on each connection.
pub(crate) struct QuicLink {
    settings: DialConfig,
    endpoint: Endpoint,
}

impl Link for QuicLink {
    type Connection = QuicConnection;
    type Error = QuicLinkError;
    const TRANSPORT: &'static str = "quic";
    const CAN_DRAIN: bool = true;
    const CAN_RESIZE: bool = true;

    async fn open(
        &self,
        options: &WorkerOptions,
        resume: Option<&switchyard_core::ResumeRequest>,
    ) -> Result<(QuicConnection, Registered), QuicLinkError> {
        QuicConnection::open(&self.endpoint, &self.settings, options, resume).await
    }

    async fn serve(
        &self,
        connection: QuicConnection,
        context: ConnectionContext<'_>,
    ) -> ConnectionEnd<QuicLinkError> {
        match connection.serve(context, &self.settings.copies).await {
            QuicLinkError::Refused {
                code: ErrorCode::Drained,
                ..
            } => {
                tracing::info!("drained; worker stopping");
                ConnectionEnd::Drained
            }
            error if error.is_permanent() => ConnectionEnd::Failed(error),
            error => ConnectionEnd::ComeBack {
                shutting_down: error.is_shutdown(),
                reason: error.to_string(),
            },
        }
    }
}

/// Builds a [`QuicWorker`].
pub struct QuicWorkerBuilder {
    addr: SocketAddr,
    server_name: String,
    options: WorkerOptions,
    tls: Option<ClientTls>,
    connection: ConnectionConfig,
    bind: Option<SocketAddr>,
    redundancy: Redundancy,
}

impl std::fmt::Debug for QuicWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicWorkerBuilder")
            .field("gateway", &self.addr)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl QuicWorkerBuilder {
    switchyard_worker::worker_option_setters!(reconnect);

    /// TLS trust (and client certificate for mutual TLS); required.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// QUIC tuning (default [`ConnectionConfig::default`] with a keep-alive of
    /// [`WORKER_KEEP_ALIVE`]).
    pub fn connection(mut self, connection: ConnectionConfig) -> Self {
        self.connection = connection;
        self
    }

    /// Local UDP address (default: any address of the gateway's family, any port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = Some(addr);
        self
    }

    /// Asks the gateway to also send small tasks as QUIC datagrams, and sends small results
    /// that way too, when the gateway agrees at registration (default [`Redundancy::Off`]).
    pub fn redundancy(mut self, redundancy: Redundancy) -> Self {
        self.redundancy = redundancy;
        self
    }

    /// Validates, opens the local socket, connects, registers and announces capacity.
    pub async fn connect(self) -> Result<QuicWorker, WorkerError> {
        self.options.validate()?;
        let tls = self.tls.ok_or(WorkerError::Invalid {
            field: "tls",
            reason: "required: QUIC always runs TLS 1.3",
        })?;
        let link_error = |error: QuicLinkError| WorkerError::link(QuicLink::TRANSPORT, error);
        self.connection
            .transport(1, self.redundancy)
            .map_err(|error| link_error(error.into()))?;
        let bind = self.bind.unwrap_or(match self.addr {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        });
        let endpoint = Endpoint::client(bind).map_err(|error| link_error(error.into()))?;
        let copies = Arc::new(RedundancyCounters::default());
        let link = QuicLink {
            settings: DialConfig {
                addr: self.addr,
                server_name: self.server_name,
                tls,
                connection: self.connection,
                redundancy: self.redundancy,
                copies: Arc::clone(&copies),
            },
            endpoint: endpoint.clone(),
        };
        let worker = Worker::connect(link, self.options).await?;
        Ok(QuicWorker {
            worker,
            endpoint,
            copies,
        })
    }
}

/// A worker connected to a gateway over QUIC.
///
/// # Examples
///
/// ```no_run
/// use bytes::Bytes;
/// use switchyard_transport_quic::{ActivityContext, ActivityError, ClientTls, QuicWorker};
///
/// # async fn serve(tls: ClientTls) -> Result<(), Box<dyn std::error::Error>> {
/// let worker = QuicWorker::builder("127.0.0.1:7443".parse()?, "localhost")
///     .namespaces(["billing"])
///     .task_queue("payments")
///     .activity("charge", |ctx: ActivityContext, input: Bytes| async move {
///         if ctx.is_cancelled() {
///             return Err(ActivityError::retryable("cancelled before start"));
///         }
///         Ok(input)
///     })
///     .max_concurrency(16)
///     .tls(tls)
///     .connect()
///     .await?;
/// worker.run().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct QuicWorker {
    worker: Worker<QuicLink>,
    endpoint: Endpoint,
    copies: Arc<RedundancyCounters>,
}

impl QuicWorker {
    /// Starts building a worker for the gateway at `addr`, whose certificate must be valid
    /// for `server_name`.
    pub fn builder(addr: SocketAddr, server_name: impl Into<String>) -> QuicWorkerBuilder {
        QuicWorkerBuilder {
            addr,
            server_name: server_name.into(),
            options: WorkerOptions::default(),
            tls: None,
            connection: ConnectionConfig {
                keep_alive_interval: Some(WORKER_KEEP_ALIVE),
                ..ConnectionConfig::default()
            },
            bind: None,
            redundancy: Redundancy::Off,
        }
    }

    /// A handle to resize, drain, rebind or observe the worker while it runs.
    pub fn handle(&self) -> QuicWorkerHandle {
        QuicWorkerHandle {
            worker: self.worker.handle(),
            endpoint: self.endpoint.clone(),
            copies: Arc::clone(&self.copies),
        }
    }

    /// The id of the first registration (a reconnection registers under a new id; see
    /// [`QuicWorkerHandle::registrations`]).
    pub fn worker_id(&self) -> WorkerId {
        self.worker.worker_id()
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        self.worker.task_queue()
    }

    /// A token that stops [`QuicWorker::run`] when cancelled: running handlers are dropped,
    /// the connection is closed (the gateway dispatches its tasks again) and `run` returns
    /// `Ok`. For a graceful stop that lets running tasks finish, see
    /// [`QuicWorkerHandle::drain`].
    pub fn shutdown_token(&self) -> CancellationToken {
        self.worker.handle().shutdown_token()
    }

    /// Serves tasks until drained, or stopped through [`QuicWorker::shutdown_token`],
    /// reconnecting after every lost connection. Fails only when a reconnection is refused
    /// for good (see [`WorkerError::is_permanent`]).
    pub async fn run(self) -> Result<(), WorkerError> {
        self.worker.run().await
    }
}

/// Controls a running [`QuicWorker`]: the shared [`switchyard_worker::WorkerHandle`]
/// operations, plus the local socket; cheap to clone.
#[derive(Clone, Debug)]
pub struct QuicWorkerHandle {
    worker: switchyard_worker::WorkerHandle,
    endpoint: Endpoint,
    copies: Arc<RedundancyCounters>,
}

impl QuicWorkerHandle {
    /// Re-announces capacity: the gateway opens or retires lanes to match. Shrinking never
    /// stops running tasks.
    pub fn set_max_concurrency(&self, max_concurrency: u32) -> Result<(), WorkerError> {
        self.worker.set_max_concurrency(max_concurrency)
    }

    /// Asks the gateway to drain this worker: no new task comes, running ones finish, then
    /// the gateway closes and [`QuicWorker::run`] returns `Ok`.
    pub fn drain(&self) -> Result<(), WorkerError> {
        self.worker.drain()
    }

    /// The id of the current registration, `None` while disconnected.
    pub fn worker_id(&self) -> Option<WorkerId> {
        self.worker.worker_id()
    }

    /// Follows registrations: the id after each (re)connection, `None` after each loss.
    pub fn registrations(&self) -> watch::Receiver<Option<WorkerId>> {
        self.worker.registrations()
    }

    /// The transport-independent handle.
    pub fn worker(&self) -> &switchyard_worker::WorkerHandle {
        &self.worker
    }

    /// Moves the worker to a new local UDP socket (a network change); the connection migrates
    /// with it when the gateway allows migration.
    pub fn rebind(&self, socket: std::net::UdpSocket) -> std::io::Result<()> {
        self.endpoint.rebind(socket)
    }

    /// The local UDP address in use.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Datagram copies of small frames sent and received so far, over every connection.
    pub fn redundancy_stats(&self) -> RedundancyStats {
        self.copies.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: ErrorCode) -> QuicLinkError {
        QuicLinkError::Refused {
            code,
            reason: String::new(),
        }
    }

    #[test]
    fn a_shutdown_or_a_reset_asks_the_worker_back_and_a_drain_does_not() {
        for back in [
            refused(ErrorCode::ShuttingDown),
            QuicLinkError::Connection(ConnectionError::Reset),
        ] {
            assert!(back.is_shutdown(), "{back}");
            assert!(!back.is_permanent(), "{back}: reconnect");
        }
        // Control: the final drain stops the worker, and a plain loss is no shutdown.
        assert!(refused(ErrorCode::Drained).is_permanent());
        assert!(!refused(ErrorCode::Drained).is_shutdown());
        assert!(!QuicLinkError::Connection(ConnectionError::TimedOut).is_shutdown());
    }

    #[test]
    fn only_resume_refused_makes_the_worker_register_afresh_at_once() {
        let refused_resume = refused(ErrorCode::ResumeRefused);
        assert!(refused_resume.is_resume_refused());
        assert!(!refused_resume.is_permanent(), "it registers afresh");
        // Control: other closes are not a refused resume.
        for other in [
            refused(ErrorCode::Superseded),
            refused(ErrorCode::Deregistered),
            QuicLinkError::Connection(ConnectionError::TimedOut),
        ] {
            assert!(!other.is_resume_refused(), "{other}");
        }
    }
}
