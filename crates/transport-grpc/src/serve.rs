//! A standalone server carrying only the worker service.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::transport::ServerTlsConfig;

use crate::listener::{AcceptConfig, limited_incoming};
use crate::service::WorkerService;

/// Why [`serve`] stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The TLS configuration was rejected.
    #[error("tls configuration rejected: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The server failed while running.
    #[error("worker server failed: {0}")]
    Server(#[source] tonic::transport::Error),
}

/// Serves `service` alone on `listener` until `shutdown` resolves, with the service's HTTP/2
/// keepalive, stream and connection limits and TCP_NODELAY and, when given, TLS with the
/// service's handshake timeout (set a client CA with optional client authentication on `tls`
/// to accept both mTLS and bearer-token workers).
///
/// An embedder serving other services on the same port mounts
/// [`WorkerService::into_server`] on its own server instead.
pub async fn serve(
    listener: TcpListener,
    tls: Option<ServerTlsConfig>,
    service: WorkerService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let config = service.config().clone();
    let mut server = config.server_builder();
    if let Some(tls) = tls {
        server = server
            .tls_config(config.tls(tls))
            .map_err(ServeError::Tls)?;
    }
    let incoming = limited_incoming(
        listener,
        AcceptConfig {
            name: "grpc",
            limits: config.connection_limits(),
            nodelay: config.tcp_nodelay,
        },
    );
    server
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(ServeError::Server)
}
