//! The operations listener's connections: accepted within `ops.max_connections`, served as
//! HTTP/1 with `ops.header_read_timeout` and `ops.idle_timeout`, told to finish when the
//! listener stops.

use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use switchyard_transport_grpc::LimitedIncoming;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use super::idle::IdleTimeout;

/// How long each connection may be held before a request completes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionTimeouts {
    /// `ops.header_read_timeout`.
    pub(crate) header_read: Duration,
    /// `ops.idle_timeout`.
    pub(crate) idle: Duration,
}

/// Serves `app` on every connection of `incoming` until `stop` fires, then lets the open ones
/// finish their request in flight.
pub(crate) async fn serve(
    mut incoming: LimitedIncoming,
    app: Router,
    timeouts: ConnectionTimeouts,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let finish = CancellationToken::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            next = incoming.next() => match next {
                Some(Ok(connection)) => {
                    connections.spawn(serve_one(connection, app.clone(), timeouts,
                        finish.clone()));
                }
                Some(Err(_)) => {}
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stop.cancelled() => break,
        }
    }
    drop(incoming);
    finish.cancel();
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_one<IO>(io: IO, app: Router, timeouts: ConnectionTimeouts, finish: CancellationToken)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(IdleTimeout::new(io, timeouts.idle));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    let connection = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(connection);
    // A connection that fails (timed out, reset, malformed) has nothing to report back.
    tokio::select! {
        _ = connection.as_mut() => {}
        () = finish.cancelled() => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
