//! How connecting and running a worker fail.

use std::time::Duration;

use tokio_tungstenite::tungstenite;

use crate::protocol::CloseCode;

/// Why [`WsWorkerBuilder::connect`](super::WsWorkerBuilder::connect) produced no worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WsLinkError {
    /// A worker option is unusable (no namespace, no handler, `max_concurrency` 0).
    #[error(transparent)]
    Invalid(#[from] switchyard_worker::WorkerError),
    /// The endpoint is not a usable `ws://` or `wss://` URL.
    #[error("endpoint {url:?}: {problem}")]
    InvalidUrl {
        /// The endpoint as given.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The bearer token cannot travel in an HTTP header (it holds a control character).
    #[error("token is not a valid HTTP header value")]
    InvalidToken,
    /// The TCP connection failed.
    #[error("connecting: {0}")]
    Io(#[from] std::io::Error),
    /// The client TLS configuration could not be built.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The TLS or WebSocket handshake failed.
    #[error("websocket handshake: {0}")]
    Handshake(#[source] tungstenite::Error),
    /// Connecting and registering took longer than the connect timeout.
    #[error("no registration answer within {0:?}")]
    Timeout(Duration),
    /// The gateway refused the registration; `message` names the field or rule.
    #[error("registration refused ({code}): {message}")]
    Refused {
        /// The close code that followed the refusal.
        code: u16,
        /// The refusal as the gateway worded it.
        message: String,
    },
    /// The socket closed or broke before the gateway answered the registration.
    #[error("socket ended before the registration was answered: {0}")]
    Closed(String),
    /// The gateway sent something the protocol does not allow here.
    #[error("gateway broke the protocol: {0}")]
    Protocol(String),
}

impl WsLinkError {
    /// The close code of a refusal, if this is one the protocol names.
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            Self::Refused { code, .. } => CloseCode::from_code(*code),
            _ => None,
        }
    }
}

/// Why [`WsWorker::run`](super::WsWorker::run) ended other than by a finished drain or a stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The gateway closed the socket (shutting down, deregistered the worker, or refused a
    /// frame); the worker may connect again.
    #[error("gateway closed the socket ({code}): {reason}")]
    Closed {
        /// The close code (see [`CloseCode`]).
        code: u16,
        /// The close reason.
        reason: String,
    },
    /// The connection broke.
    #[error("connection lost: {0}")]
    Lost(String),
    /// The gateway sent something the protocol does not allow; the worker closed the socket.
    #[error("gateway broke the protocol: {0}")]
    Protocol(String),
}

impl RunError {
    /// The close code the gateway closed with, if it did and the protocol names it.
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            Self::Closed { code, .. } => CloseCode::from_code(*code),
            _ => None,
        }
    }
}
