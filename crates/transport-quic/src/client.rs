//! The Rust worker SDK for the QUIC transport.
//!
//! Same shape as the gRPC SDK, so switching a worker between transports is a one-line change:
//! a builder naming the pool and the handlers, [`QuicWorkerBuilder::connect`] for the first
//! registration, then [`QuicWorker::run`], which serves tasks and reconnects with jittered
//! backoff until the worker is drained or refused for good. Capacity is announced right after
//! each registration; the worker grants the gateway one lane (stream) per slot, so
//! concurrency is bounded by the link itself. Pings are answered on the lane they arrive on,
//! a cancel fires the handler's cancellation token, and a drain lets running tasks finish.

mod lane;
mod session;
mod unwind;

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use quinn::{ConnectError, ConnectionError, Endpoint};
use switchyard_core::WorkerId;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use switchyard_core::Backoff;
pub use switchyard_core::{ActivityContext, ActivityError, ActivityFuture, ActivityHandler};

use crate::config::{ConfigError, LinkSettings};
use crate::protocol::ErrorCode;
use crate::tls::ClientTls;
/// A registered handler, shared by every lane.
pub(crate) type Handler = std::sync::Arc<dyn ActivityHandler>;
use session::{Session, SessionEnd};

/// The worker's default QUIC keep-alive interval: the longest it stays silent when the gateway
/// is.
///
/// While the gateway is up its pings reach the worker more often than this, so no keep-alive
/// is sent; once the gateway is gone, the keep-alive is what draws the stateless reset of a
/// restarted gateway, so the worker notices the restart within seconds instead of at its
/// idle timeout.
pub const WORKER_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Why a worker could not start or stopped for good.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The builder was given something unusable.
    #[error("worker configuration: {0}")]
    Invalid(String),
    /// A link setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The local UDP socket could not be opened.
    #[error("local udp socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The connection could not be started (bad server name, unsupported address).
    #[error("connect: {0}")]
    Connect(#[from] ConnectError),
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
    /// Connecting and registering took longer than the connect timeout.
    #[error("no registration within {0:?}")]
    Timeout(Duration),
}

impl From<ConnectionError> for WorkerError {
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

impl WorkerError {
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

    /// True when reconnecting cannot help (configuration, or a refusal the gateway marks
    /// final such as `UNAUTHENTICATED` or `CAPACITY_REFUSED`).
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Invalid(_) | Self::Config(_) | Self::Connect(_) => true,
            Self::Refused { code, .. } => code.is_final(),
            _ => false,
        }
    }
}

/// Fixed facts of a worker, shared by every session.
pub(crate) struct Settings {
    addr: SocketAddr,
    server_name: String,
    namespaces: Vec<String>,
    task_queue: String,
    node: String,
    identity: String,
    token: Option<String>,
    tls: ClientTls,
    link: LinkSettings,
    handlers: Arc<HashMap<String, Handler>>,
    backoff: Backoff,
    connect_timeout: Duration,
}

/// What the handle changes and observes, shared with the running sessions.
pub(crate) struct Shared {
    capacity: watch::Sender<u32>,
    drain: CancellationToken,
    stop: CancellationToken,
    registered: watch::Sender<Option<WorkerId>>,
    endpoint: Endpoint,
}

/// Builds a [`QuicWorker`].
pub struct QuicWorkerBuilder {
    addr: SocketAddr,
    server_name: String,
    namespaces: Vec<String>,
    task_queue: String,
    node: String,
    identity: Option<String>,
    token: Option<String>,
    tls: Option<ClientTls>,
    link: LinkSettings,
    handlers: HashMap<String, Handler>,
    max_concurrency: u32,
    backoff: Backoff,
    connect_timeout: Duration,
    bind: Option<SocketAddr>,
}

impl QuicWorkerBuilder {
    /// Namespaces served (at least one).
    pub fn namespaces<I, S>(mut self, namespaces: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.namespaces = namespaces.into_iter().map(Into::into).collect();
        self
    }

    /// Task queue within each namespace (default: the default queue).
    pub fn task_queue(mut self, task_queue: impl Into<String>) -> Self {
        self.task_queue = task_queue.into();
        self
    }

    /// Locality label (default: none).
    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.node = node.into();
        self
    }

    /// Free-form identity shown to operators (default: `pid <pid>`).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// Runs `handler` for tasks of `activity_type`.
    pub fn activity(
        mut self,
        activity_type: impl Into<String>,
        handler: impl ActivityHandler,
    ) -> Self {
        self.handlers
            .insert(activity_type.into(), Arc::new(handler));
        self
    }

    /// Tasks run at once (default 16); announced right after registering, and the number of
    /// lanes the gateway may open.
    pub fn max_concurrency(mut self, max_concurrency: u32) -> Self {
        self.max_concurrency = max_concurrency;
        self
    }

    /// TLS trust (and client certificate for mutual TLS); required.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Bearer token sent in the registration frame.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// QUIC tuning (default [`LinkSettings::default`] with a keep-alive of
    /// [`WORKER_KEEP_ALIVE`]).
    pub fn link(mut self, link: LinkSettings) -> Self {
        self.link = link;
        self
    }

    /// Delays between reconnection attempts (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Longest time to connect and register, per attempt (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Local UDP address (default: any address of the gateway's family, any port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = Some(addr);
        self
    }

    /// Opens the local socket, connects, registers and announces capacity.
    pub async fn connect(self) -> Result<QuicWorker, WorkerError> {
        if self.namespaces.is_empty() {
            return Err(WorkerError::Invalid("namespaces is empty".into()));
        }
        if self.handlers.is_empty() {
            return Err(WorkerError::Invalid(
                "activity_types is empty: register at least one activity handler".into(),
            ));
        }
        if self.max_concurrency == 0 {
            return Err(WorkerError::Invalid(
                "max_concurrency 0: a worker must accept at least one task".into(),
            ));
        }
        let tls = self.tls.ok_or_else(|| {
            WorkerError::Invalid("tls is required: QUIC always runs TLS 1.3".into())
        })?;
        self.link.transport(1)?;
        let bind = self.bind.unwrap_or(match self.addr {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        });
        let endpoint = Endpoint::client(bind)?;
        let settings = Arc::new(Settings {
            addr: self.addr,
            server_name: self.server_name,
            namespaces: self.namespaces,
            task_queue: self.task_queue,
            node: self.node,
            identity: self
                .identity
                .unwrap_or_else(|| format!("rust-sdk pid {}", std::process::id())),
            token: self.token,
            tls,
            link: self.link,
            handlers: Arc::new(self.handlers),
            backoff: self.backoff,
            connect_timeout: self.connect_timeout,
        });
        let shared = Arc::new(Shared {
            capacity: watch::Sender::new(self.max_concurrency),
            drain: CancellationToken::new(),
            stop: CancellationToken::new(),
            registered: watch::Sender::new(None),
            endpoint,
        });
        let session = open(&settings, &shared).await?;
        Ok(QuicWorker {
            worker_id: session.worker(),
            task_queue: session.task_queue().to_owned(),
            settings,
            shared,
            session: Some(session),
        })
    }
}

async fn open(settings: &Settings, shared: &Shared) -> Result<Session, WorkerError> {
    tokio::time::timeout(
        settings.connect_timeout,
        Session::open(&shared.endpoint, settings, shared),
    )
    .await
    .map_err(|_| WorkerError::Timeout(settings.connect_timeout))?
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
pub struct QuicWorker {
    worker_id: WorkerId,
    task_queue: String,
    settings: Arc<Settings>,
    shared: Arc<Shared>,
    session: Option<Session>,
}

impl std::fmt::Debug for QuicWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicWorker")
            .field("gateway", &self.settings.addr)
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}

impl QuicWorker {
    /// Starts building a worker for the gateway at `addr`, whose certificate must be valid
    /// for `server_name`.
    pub fn builder(addr: SocketAddr, server_name: impl Into<String>) -> QuicWorkerBuilder {
        QuicWorkerBuilder {
            addr,
            server_name: server_name.into(),
            namespaces: Vec::new(),
            task_queue: String::new(),
            node: String::new(),
            identity: None,
            token: None,
            tls: None,
            link: LinkSettings {
                keep_alive_interval: Some(WORKER_KEEP_ALIVE),
                ..LinkSettings::default()
            },
            handlers: HashMap::new(),
            max_concurrency: 16,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(10),
            bind: None,
        }
    }

    /// A handle to resize, drain, rebind or observe the worker while it runs.
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle(Arc::clone(&self.shared))
    }

    /// The id of the first registration (a reconnection registers under a new id; see
    /// [`WorkerHandle::registrations`]).
    pub fn worker_id(&self) -> WorkerId {
        self.worker_id
    }

    /// The task queue the gateway registered the worker in (never empty).
    pub fn task_queue(&self) -> &str {
        &self.task_queue
    }

    /// A token that stops [`QuicWorker::run`] when cancelled: running handlers are dropped,
    /// the connection is closed (the gateway dispatches its tasks again) and `run` returns
    /// `Ok`. For a graceful stop that lets running tasks finish, see [`WorkerHandle::drain`].
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.stop.clone()
    }

    /// Serves tasks until drained, or stopped through [`QuicWorker::shutdown_token`],
    /// reconnecting after every lost connection. Fails only when a reconnection is refused
    /// for good (see [`WorkerError::is_permanent`]).
    pub async fn run(mut self) -> Result<(), WorkerError> {
        let mut attempt: u32 = 0;
        loop {
            let session = match self.session.take() {
                Some(session) => session,
                None => {
                    let delay = self.settings.backoff.delay(attempt, &mut rand::rng());
                    attempt = attempt.saturating_add(1);
                    tracing::info!(gateway = %self.settings.addr, attempt,
                        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        "reconnecting to the gateway");
                    let opened = tokio::select! {
                        () = self.shared.stop.cancelled() => return Ok(()),
                        // Nothing is held while disconnected, so a drain is already complete.
                        () = self.shared.drain.cancelled() => return Ok(()),
                        opened = async {
                            tokio::time::sleep(delay).await;
                            open(&self.settings, &self.shared).await
                        } => opened,
                    };
                    match opened {
                        Ok(session) => {
                            tracing::info!(worker = %session.worker(), attempt, "registered again");
                            attempt = 0;
                            session
                        }
                        Err(error) if error.is_permanent() => return Err(error),
                        Err(error) => {
                            tracing::warn!(%error, attempt, "reconnection failed");
                            continue;
                        }
                    }
                }
            };
            // Dropping the session on stop drops its lanes and closes the connection.
            let ended = tokio::select! {
                ended = session.serve(&self.shared) => ended,
                () = self.shared.stop.cancelled() => return Ok(()),
            };
            match ended {
                SessionEnd::Drained => {
                    tracing::info!("drained; worker stopping");
                    return Ok(());
                }
                SessionEnd::Lost(error) if error.is_permanent() => return Err(error),
                SessionEnd::Lost(error) => {
                    if self.shared.drain.is_cancelled() {
                        tracing::info!(%error, "connection ended while draining; worker stopping");
                        return Ok(());
                    }
                    if error.is_shutdown() {
                        tracing::info!(gateway = %self.settings.addr, %error,
                            "the gateway shut down; reconnecting with backoff");
                    } else {
                        tracing::warn!(gateway = %self.settings.addr, %error,
                            "lost the gateway; reconnecting with backoff");
                    }
                }
            }
        }
    }
}

/// Controls a running [`QuicWorker`]; cheap to clone.
#[derive(Clone)]
pub struct WorkerHandle(Arc<Shared>);

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("worker", &*self.0.registered.borrow())
            .finish()
    }
}

impl WorkerHandle {
    /// Re-announces capacity: the gateway opens or retires lanes to match. Shrinking never
    /// stops running tasks.
    pub fn set_max_concurrency(&self, max_concurrency: u32) -> Result<(), WorkerError> {
        if max_concurrency == 0 {
            return Err(WorkerError::Invalid(
                "max_concurrency 0: a worker must accept at least one task".into(),
            ));
        }
        self.0.capacity.send_replace(max_concurrency);
        Ok(())
    }

    /// Asks the gateway to drain this worker: no new task comes, running ones finish, then
    /// the gateway closes and [`QuicWorker::run`] returns `Ok`.
    pub fn drain(&self) {
        self.0.drain.cancel();
    }

    /// The id of the current registration, `None` while disconnected.
    pub fn worker_id(&self) -> Option<WorkerId> {
        *self.0.registered.borrow()
    }

    /// Follows registrations: the id after each (re)connection, `None` after each loss.
    pub fn registrations(&self) -> watch::Receiver<Option<WorkerId>> {
        self.0.registered.subscribe()
    }

    /// Moves the worker to a new local UDP socket (a network change); the connection migrates
    /// with it when the gateway allows migration.
    pub fn rebind(&self, socket: std::net::UdpSocket) -> std::io::Result<()> {
        self.0.endpoint.rebind(socket)
    }

    /// The local UDP address in use.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.0.endpoint.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: ErrorCode) -> WorkerError {
        WorkerError::Refused {
            code,
            reason: String::new(),
        }
    }

    #[test]
    fn a_shutdown_or_a_reset_asks_the_worker_back_and_a_drain_does_not() {
        for back in [
            refused(ErrorCode::ShuttingDown),
            WorkerError::Connection(ConnectionError::Reset),
        ] {
            assert!(back.is_shutdown(), "{back}");
            assert!(!back.is_permanent(), "{back}: reconnect");
        }
        // Control: the final drain stops the worker, and a plain loss is no shutdown.
        assert!(refused(ErrorCode::Drained).is_permanent());
        assert!(!refused(ErrorCode::Drained).is_shutdown());
        assert!(!WorkerError::Connection(ConnectionError::TimedOut).is_shutdown());
    }
}
