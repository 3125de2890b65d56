//! The gateway side: a QUIC endpoint that admits workers through core and pushes tasks to
//! them over lanes.
//!
//! Before the gateway keeps any state for a connection, its intake (`server/intake.rs`) decides
//! on the first packet: a stateless Retry, a refusal naming the limit, or the handshake.
//! Per connection: the worker opens the control stream and registers (no capacity); the
//! gateway admits the worker through core's gate, opens lane 0, answers `QuicRegistered`,
//! announces the worker to core (pings start), and opens one lane per announced capacity slot
//! before telling core the capacity. A worker core lets go (its token's departure) has its
//! connection closed with `DEREGISTERED`. Every frame
//! a worker sends on a lane goes to core (`complete`, `cancel_acknowledged`, `record_pong`);
//! every refusal or violation closes the connection with a documented code, and the
//! connection's end deregisters the worker exactly once (its registration token).
//!
//! Sessions (`server/admit.rs`): a worker that registers as `resumable` gets a session when
//! `reconnect_grace` is above zero; a connection lost without a goodbye then suspends it
//! instead (core keeps its slots and tasks), and a new connection's `resume` reattaches it,
//! each task core still holds put on a lane of its own with a `held` frame. Results are
//! acknowledged in batches (`server/acks.rs`) so the worker knows what it may forget.

pub(crate) mod acks;
mod admit;
mod connection;
mod datagram;
mod delivery;
mod intake;
mod lane;
mod lanes;
mod refusals;
mod reset;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use quinn::{Endpoint, Incoming};
use switchyard_core::{Core, WorkerId};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use delivery::TRANSPORT;

use crate::config::{ConfigError, QuicServerConfig};
use crate::protocol::ErrorCode;
use crate::redundancy::{RedundancyCounters, RedundancyStats};
use crate::tls::ServerTls;
use delivery::QuicDelivery;
use intake::{SharedIntake, Verdict};
use refusals::Refusals;
use switchyard_auth::{AllowAll, Authenticate};

/// Why the QUIC listener could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The UDP socket could not be bound.
    #[error("quic listener on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
}

/// Time a shutdown allows a connection's driver beyond its flush.
const SHUTDOWN_SLACK: std::time::Duration = std::time::Duration::from_millis(500);

/// State shared by the accept loop and every connection.
pub(crate) struct ServerShared {
    pub(crate) core: Core,
    pub(crate) config: QuicServerConfig,
    pub(crate) auth: Arc<dyn Authenticate>,
    /// Refused connections, counted and logged (throttled).
    pub(crate) refusals: Refusals,
    /// Datagram copies sent and received over every connection.
    pub(crate) copies: Arc<RedundancyCounters>,
    /// Registered connections, for the flushed close at shutdown and the count.
    connections: Mutex<HashMap<WorkerId, Weak<QuicDelivery>>>,
}

impl ServerShared {
    fn connections(&self) -> MutexGuard<'_, HashMap<WorkerId, Weak<QuicDelivery>>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn track(&self, worker: WorkerId, delivery: &Arc<QuicDelivery>) {
        self.connections().insert(worker, Arc::downgrade(delivery));
    }

    /// Forgets `delivery`'s connection of `worker`, unless a resumed one replaced it.
    pub(crate) fn untrack(&self, worker: WorkerId, delivery: &Arc<QuicDelivery>) {
        let mut connections = self.connections();
        let current = connections
            .get(&worker)
            .is_some_and(|tracked| std::ptr::eq(tracked.as_ptr(), Arc::as_ptr(delivery)));
        if current {
            connections.remove(&worker);
        }
    }
}

/// Builds a [`QuicServer`].
pub struct QuicServerBuilder {
    core: Core,
    tls: ServerTls,
    config: QuicServerConfig,
    auth: Arc<dyn Authenticate>,
    reset_key: Option<ring::hmac::Key>,
}

impl QuicServerBuilder {
    /// Settings (default [`QuicServerConfig::default`]).
    pub fn config(mut self, config: QuicServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Who may register (default [`AllowAll`]): the registration's `auth_token` and the verified
    /// client certificate go to `auth`; a refusal closes with `UNAUTHENTICATED`.
    pub fn authenticator(mut self, auth: Arc<dyn Authenticate>) -> Self {
        self.auth = auth;
        self
    }

    /// Derives the stateless-reset key from `material`, secret bytes that outlive the process
    /// (default: a random key per process).
    ///
    /// QUIC lets a server that lost a connection's state tell the peer at once with a
    /// stateless reset, but only when it can compute the reset token it promised, which it
    /// derives from this key. With the same material after a restart (even after `kill -9`),
    /// the new process resets the old connections on their first packet and the workers
    /// reconnect at once instead of waiting for their idle timeout.
    pub fn stateless_reset_key(mut self, material: &[u8]) -> Self {
        self.reset_key = Some(reset::reset_key(material));
        self
    }

    /// Binds the UDP socket and starts accepting workers on the current tokio runtime.
    pub async fn bind(self) -> Result<QuicServer, ServerError> {
        let config = self.config;
        config.check()?;
        // A worker may open exactly one stream: its control stream.
        let transport = config.connection.transport(1, config.redundancy)?;
        let mut quic = quinn::ServerConfig::with_crypto(self.tls.quic());
        quic.transport_config(Arc::new(transport))
            .migration(config.migration);
        let socket =
            bind_udp(config.listen, config.socket_buffer).map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let endpoint_config = match self.reset_key {
            Some(key) => {
                let mut endpoint = quinn::EndpointConfig::new(Arc::new(key));
                endpoint.cid_generator(|| Box::new(reset::RandomCids));
                endpoint
            }
            None => quinn::EndpointConfig::default(),
        };
        let endpoint = Endpoint::new(
            endpoint_config,
            Some(quic),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let local_addr = endpoint.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        let intake = SharedIntake::new(&config);
        let shared = Arc::new(ServerShared {
            core: self.core,
            config,
            auth: self.auth,
            refusals: Refusals::default(),
            copies: Arc::new(RedundancyCounters::exported()),
            connections: Mutex::new(HashMap::new()),
        });
        let accept = tokio::spawn(accept_loop(
            endpoint.clone(),
            Arc::clone(&shared),
            intake.clone(),
        ));
        tracing::info!(%local_addr, "quic worker listener started");
        Ok(QuicServer {
            endpoint,
            local_addr,
            shared,
            intake,
            accept,
        })
    }
}

async fn accept_loop(endpoint: Endpoint, shared: Arc<ServerShared>, intake: SharedIntake) {
    while let Some(incoming) = endpoint.accept().await {
        arrive(incoming, &shared, &intake);
    }
}

/// Applies the intake's decision to a new connection: its handshake, a stateless Retry, or a
/// refusal (`CONNECTION_REFUSED`), counted and logged throttled.
fn arrive(incoming: Incoming, shared: &Arc<ServerShared>, intake: &SharedIntake) {
    let remote = incoming.remote_address();
    match intake.arrive(remote.ip(), incoming.remote_address_validated()) {
        Verdict::Handshake(pass) => {
            tokio::spawn(connection::serve(incoming, Arc::clone(shared), pass));
        }
        Verdict::Retry => match incoming.retry() {
            Ok(()) => crate::metrics::retried(),
            // Only a validated connection cannot be retried, and the intake retries none.
            Err(error) => error.into_incoming().refuse(),
        },
        Verdict::Refuse(refusal) => {
            shared.refusals.refused(refusal, remote, Instant::now());
            incoming.refuse();
        }
    }
}

/// The gateway's QUIC listener for workers.
///
/// # Examples
///
/// ```no_run
/// use switchyard_core::{Core, CoreConfig, Registry};
/// use switchyard_transport_quic::{QuicServer, QuicServerConfig, ServerTls};
///
/// # async fn start(tls: ServerTls) -> Result<(), Box<dyn std::error::Error>> {
/// let core = Core::start(Registry::builder(), CoreConfig::default());
/// let server = QuicServer::builder(core, tls)
///     .config(QuicServerConfig { listen: "127.0.0.1:7443".parse()?, ..QuicServerConfig::default() })
///     .bind()
///     .await?;
/// println!("workers connect to {}", server.local_addr());
/// # Ok(())
/// # }
/// ```
pub struct QuicServer {
    endpoint: Endpoint,
    local_addr: SocketAddr,
    shared: Arc<ServerShared>,
    intake: SharedIntake,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for QuicServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl QuicServer {
    /// Starts building a listener that admits workers into `core`.
    pub fn builder(core: Core, tls: ServerTls) -> QuicServerBuilder {
        QuicServerBuilder {
            core,
            tls,
            config: QuicServerConfig::default(),
            auth: Arc::new(AllowAll),
            reset_key: None,
        }
    }

    /// The bound UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Workers registered through this listener right now.
    pub fn registered_workers(&self) -> usize {
        self.shared.connections().len()
    }

    /// Connections through their handshake and not yet registered right now: what counts
    /// against `max_unregistered_connections`.
    pub fn unregistered_connections(&self) -> usize {
        self.intake.unregistered()
    }

    /// Datagram copies of small frames sent and received so far (`quic.redundancy`).
    pub fn redundancy_stats(&self) -> RedundancyStats {
        self.shared.copies.snapshot()
    }

    /// Closes every connection with `SHUTTING_DOWN` and stops accepting. Drain the workers
    /// first (core's shutdown does) to let their tasks finish.
    pub fn close(&self) {
        self.accept.abort();
        self.endpoint.close(
            ErrorCode::ShuttingDown.var_int(),
            b"the gateway is shutting down",
        );
    }

    /// Stops accepting, then closes every registered connection with `SHUTTING_DOWN` once the
    /// frames queued toward it (a `drain`, the cancels of the shutdown) have reached the worker,
    /// waiting at most about a second for a worker that does not acknowledge them; other
    /// connections are closed at once. Call it after core's shutdown.
    pub async fn shutdown(&self) {
        self.accept.abort();
        let deliveries: Vec<Arc<QuicDelivery>> = self
            .shared
            .connections()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for delivery in &deliveries {
            delivery.close_when_flushed();
        }
        let closed = async {
            for delivery in &deliveries {
                delivery.connection().closed().await;
            }
        };
        // The flush is bounded per connection; this bounds a connection driver that is stuck.
        let _ = tokio::time::timeout(delivery::FLUSH_PATIENCE + SHUTDOWN_SLACK, closed).await;
        self.close();
    }

    /// Waits until every connection has been closed and its peer told.
    pub async fn wait_idle(&self) {
        self.endpoint.wait_idle().await;
    }
}

impl Drop for QuicServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The listening UDP socket, with the kernel asked for `buffer` bytes each way; the kernel may
/// grant less (its `rmem_max` / `wmem_max`), which is logged, not refused.
fn bind_udp(addr: SocketAddr, buffer: usize) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    // IPV6_V6ONLY is left at the system default, as `quinn::Endpoint::server` leaves it.
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if buffer > 0 {
        if let Err(error) = socket
            .set_recv_buffer_size(buffer)
            .and_then(|()| socket.set_send_buffer_size(buffer))
        {
            tracing::warn!(buffer, %error, "the kernel refused the QUIC socket buffer size");
        }
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    // The address bound (with the port the kernel chose for port 0), as the log should name it.
    let addr = socket
        .local_addr()
        .ok()
        .and_then(|bound| bound.as_socket())
        .unwrap_or(addr);
    // Linux reports twice what it granted; less than asked means `net.core.rmem_max` capped it.
    let receive = socket.recv_buffer_size().ok();
    if buffer > 0 && receive.is_some_and(|granted| granted < buffer) {
        tracing::warn!(
            %addr,
            asked = buffer,
            receive,
            "the kernel granted a smaller QUIC receive buffer than asked; raise net.core.rmem_max"
        );
    } else {
        tracing::info!(%addr, asked = buffer, receive, "QUIC socket buffers");
    }
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listener_asks_the_kernel_for_its_socket_buffer() {
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let default = socket2::Socket::from(bind_udp(loopback, 0).unwrap())
            .recv_buffer_size()
            .unwrap();
        let asked = socket2::Socket::from(bind_udp(loopback, 2 * default).unwrap())
            .recv_buffer_size()
            .unwrap();
        // The kernel grants up to its rmem_max (and Linux reports twice what was granted); any
        // grant above the default shows the size was asked for.
        assert!(asked > default, "asked {asked}, default {default}");
    }
}
