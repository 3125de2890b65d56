//! The [`Transport`] trait: how the gateway starts a worker transport and stops it.
//!
//! Built-in transports and an integrator's own go through this one trait. A transport is
//! started once against the shared [`TransportContext`] (the process-wide [`Core`], the
//! principal table, the TLS material) and answers with the addresses it listens on and the
//! future that serves them. Shutdown comes in two steps so that workers can drain: first
//! [`TransportContext::stop_accepting`] fires (take no new worker, keep the existing
//! connections), then, once core has drained every worker or the drain timeout passed,
//! [`TransportContext::close`] fires (close what is left). The serving future ends after that.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use switchyard_core::{Core, DurableDispatcher};
use tokio_util::sync::CancellationToken;

use crate::auth::Principals;
use crate::tls::TlsMaterial;

/// What every transport is started with.
#[derive(Clone)]
pub struct TransportContext {
    /// The process-wide core: the one registry, admission gate, dispatcher and prober.
    pub core: Core,
    /// The durable dispatcher over the core's dispatcher and the dispatch store, for a
    /// transport that serves producers durable dispatches.
    pub durable: DurableDispatcher,
    /// The principal table workers and producers authenticate against.
    pub principals: Arc<Principals>,
    /// The gateway's server certificate, key and optional client CA.
    pub tls: Arc<TlsMaterial>,
    /// Fires when the gateway starts its shutdown grace: keep existing connections and stop
    /// taking new workers (core refuses their registration anyway). A transport that also
    /// serves producers keeps accepting them until `close`, so they hear `shutting_down`
    /// rather than a transport error.
    pub stop_accepting: CancellationToken,
    /// Fires after the drain: close every remaining connection and end the serving future.
    pub close: CancellationToken,
    /// In cluster mode: the node's admin handle, which makes the producer API's views and
    /// drains cluster-wide; `None` outside a cluster.
    pub cluster: Option<switchyard_cluster::Admin>,
}

impl fmt::Debug for TransportContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportContext")
            .field("core", &self.core)
            .field("development", &self.principals.is_development())
            .finish_non_exhaustive()
    }
}

/// Which kind of socket an address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// A TCP listener.
    Tcp,
    /// A UDP socket.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        })
    }
}

/// A bound address of a started transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddr {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The address actually bound (with the real port when configured as 0).
    pub addr: SocketAddr,
}

/// A started transport: where it listens and the future that serves it.
pub struct Listening {
    /// The bound addresses.
    pub addrs: Vec<ListenAddr>,
    /// Serves until [`TransportContext::close`] fires (or a fatal error); the gateway spawns it.
    pub serving: BoxFuture<'static, Result<(), TransportError>>,
}

impl fmt::Debug for Listening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listening")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

/// Why a transport could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Its socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Its TLS configuration was refused.
    #[error("tls: {0}")]
    Tls(String),
    /// Anything else the transport reports.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl TransportError {
    /// Wraps a transport's own error.
    pub fn other(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Other(Box::new(error))
    }
}

/// A worker transport the gateway can start; object-safe, so it is held as
/// `Box<dyn Transport>`.
///
/// # Examples
///
/// A transport with nothing to accept, to show the shape (a real one binds a socket in
/// `start`, admits workers through `context.core.registry().admit(..)` and hands their frames to
/// `context.core`):
///
/// ```
/// use async_trait::async_trait;
/// use switchyard_gateway::{Listening, Transport, TransportContext, TransportError};
///
/// struct Idle;
///
/// #[async_trait]
/// impl Transport for Idle {
///     fn name(&self) -> &str {
///         "idle"
///     }
///
///     async fn start(
///         self: Box<Self>,
///         context: TransportContext,
///     ) -> Result<Listening, TransportError> {
///         Ok(Listening {
///             addrs: Vec::new(),
///             serving: Box::pin(async move {
///                 context.close.cancelled().await;
///                 Ok(())
///             }),
///         })
///     }
/// }
///
/// let transport: Box<dyn Transport> = Box::new(Idle);
/// assert_eq!(transport.name(), "idle");
/// ```
#[async_trait]
pub trait Transport: Send {
    /// A short name for logs, readiness and listings (`grpc`, `quic`, `websocket`).
    fn name(&self) -> &str;

    /// Binds and starts serving; returns once the transport listens, so the gateway can
    /// report ready. Errors here abort the gateway's start.
    async fn start(self: Box<Self>, context: TransportContext)
    -> Result<Listening, TransportError>;
}
