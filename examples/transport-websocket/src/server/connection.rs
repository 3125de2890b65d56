//! One accepted TCP connection up to an open WebSocket: TLS, then the HTTP upgrade.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, header};

use super::state::ServerState;
use super::worker_socket;
use crate::protocol::SUBPROTOCOL;

/// Serves one connection until it closes; every stage before registration shares one deadline.
pub(super) async fn serve(state: Arc<ServerState>, stream: TcpStream) {
    let deadline = Instant::now() + state.config.registration_timeout;
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not disable Nagle's algorithm");
    }
    match state.tls.clone() {
        Some(acceptor) => {
            let handshake = tokio::select! {
                () = state.accepting.cancelled() => return,
                handshake = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => handshake,
            };
            match handshake {
                Ok(Ok(tls)) => upgrade(state, tls, deadline).await,
                Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake did not finish before the deadline"),
            }
        }
        None => upgrade(state, stream, deadline).await,
    }
}

/// Answers the upgrade request, keeping its `Authorization` header for the worker socket.
async fn upgrade<S>(state: Arc<ServerState>, stream: S, deadline: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut authorization: Option<HeaderValue> = None;
    // The callback's signature, large error response included, is tungstenite's.
    #[allow(clippy::result_large_err)]
    let callback = |request: &Request, mut response: Response| {
        authorization = request.headers().get(header::AUTHORIZATION).cloned();
        if offers_subprotocol(request) {
            response.headers_mut().insert(
                header::SEC_WEBSOCKET_PROTOCOL,
                HeaderValue::from_static(SUBPROTOCOL),
            );
        }
        Ok(response)
    };
    let accept = tokio_tungstenite::accept_hdr_async_with_config(
        stream,
        callback,
        Some(state.config.websocket()),
    );
    let upgraded = tokio::select! {
        () = state.accepting.cancelled() => return,
        upgraded = tokio::time::timeout_at(deadline, accept) => upgraded,
    };
    match upgraded {
        Ok(Ok(socket)) => worker_socket::run(state, socket, authorization, deadline).await,
        Ok(Err(error)) => tracing::debug!(%error, "websocket upgrade failed"),
        Err(_) => tracing::debug!("websocket upgrade did not finish before the deadline"),
    }
}

/// True when the client lists this protocol among the subprotocols it offers.
fn offers_subprotocol(request: &Request) -> bool {
    request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|list| list.split(','))
        .any(|offered| offered.trim() == SUBPROTOCOL)
}
