//! [`WsServer`]: the listener that admits WebSocket workers into a [`Core`].

mod connection;
mod state;
mod worker_socket;
mod writer;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use switchyard_core::Core;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::WsServerConfig;
use state::ServerState;
use switchyard_auth::Authenticate;

/// The WebSocket worker listener over one [`Core`]; dropping it stops accepting and closes
/// every worker socket in the background, [`WsServer::shutdown`] does so and waits.
///
/// Stopping comes in two steps, so workers can drain in between: [`WsServer::stop_accepting`]
/// refuses new connections and registrations and keeps registered workers; then
/// [`WsServer::shutdown`] closes what is left.
///
/// Each accepted connection runs on its own task: the TLS handshake (if configured), the
/// WebSocket upgrade, the `register` frame within the registration timeout, authentication
/// with the embedder's [`Authenticate`], and then core's admission gate, the only way in. The
/// [`RegistrationToken`](switchyard_core::RegistrationToken) lives in that task, so the socket
/// ending for any reason deregisters the worker exactly once. Frames from the worker go to
/// core's entry points as they arrive; core's messages to the worker go through a bounded
/// queue that a separate writer task drains, so a worker that stops reading never blocks
/// the reading of its results.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> std::io::Result<()> {
/// use std::sync::Arc;
/// use switchyard_core::{CallerIdentity, Core, CoreConfig, Registry};
/// use switchyard_auth::CallerTable;
/// use switchyard_transport_websocket::{WsServer, WsServerConfig};
///
/// let core = Core::start(Registry::builder(), CoreConfig::default());
/// let tokens = CallerTable::new().with_token("s3cret", CallerIdentity::trusted("workers"));
/// let server =
///     WsServer::bind("0.0.0.0:7443", core, Arc::new(tokens), WsServerConfig::default()).await?;
/// println!("workers connect to ws://{}/", server.local_addr());
/// server.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct WsServer {
    local_addr: SocketAddr,
    accepting: CancellationToken,
    stop: CancellationToken,
    connections: TaskTracker,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for WsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsServer")
            .field("local_addr", &self.local_addr)
            .field("connections", &self.connections.len())
            .finish_non_exhaustive()
    }
}

impl WsServer {
    /// Binds `addr` and starts serving workers into `core`.
    pub async fn bind(
        addr: impl ToSocketAddrs,
        core: Core,
        auth: Arc<dyn Authenticate>,
        config: WsServerConfig,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Self::serve(listener, core, auth, config)
    }

    /// Starts serving workers into `core` on an already bound listener.
    pub fn serve(
        listener: TcpListener,
        core: Core,
        auth: Arc<dyn Authenticate>,
        config: WsServerConfig,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let connections = TaskTracker::new();
        let state = ServerState::new(core, auth, config, stop.clone());
        let accepting = state.accepting.clone();
        let span = tracing::info_span!("ws_listener", %local_addr);
        let accept = tokio::spawn(
            accept_loop(listener, state, connections.clone(), accepting.clone()).instrument(span),
        );
        tracing::info!(%local_addr, "websocket worker transport listening");
        Ok(Self {
            local_addr,
            accepting,
            stop,
            connections,
            accept,
        })
    }

    /// The address workers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops taking new workers: the listener closes, connections not yet registered are
    /// refused with 1001, registered workers keep their sockets (to drain).
    pub fn stop_accepting(&self) {
        self.accepting.cancel();
    }

    /// Stops accepting, closes every worker socket with 1001 (going away), which deregisters
    /// the workers, and waits for their tasks to end (each bounded by the close timeout).
    ///
    /// Run the dispatcher's own shutdown first if in-flight work should finish: closing a
    /// worker's socket hands its tasks back to core for another worker.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.connections.close();
        self.connections.wait().await;
        tracing::info!(local_addr = %self.local_addr, "websocket worker transport stopped");
    }
}

impl Drop for WsServer {
    fn drop(&mut self) {
        self.stop.cancel();
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<ServerState>,
    connections: TaskTracker,
    accepting: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(state.config.max_connections.max(1)));
    loop {
        // Take a slot before accepting, so past the limit clients wait in the backlog rather
        // than costing a task and a buffer each.
        let slot = tokio::select! {
            () = accepting.cancelled() => return,
            slot = Arc::clone(&slots).acquire_owned() => slot,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            () = accepting.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let span = tracing::info_span!("ws_worker", %peer,
                    principal = tracing::field::Empty, worker = tracing::field::Empty,
                    namespaces = tracing::field::Empty);
                let state = Arc::clone(&state);
                connections.spawn(
                    async move {
                        connection::serve(state, stream).await;
                        drop(slot);
                    }
                    .instrument(span),
                );
            }
            Err(error) => {
                // Per-connection failures (reset before accept, descriptor limits) pass; the
                // pause keeps a persistent one from spinning the loop.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
