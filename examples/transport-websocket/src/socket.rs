//! Reading and closing a WebSocket, shared by the gateway and the worker client.

use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

use crate::protocol::CloseCode;
use crate::protocol::fit_reason;

/// Most messages read while waiting for the peer's close frame.
const CLOSE_DRAIN_LIMIT: usize = 1024;

/// A message as the protocol sees it: WebSocket pings and pongs are skipped (the library
/// answers them), everything else ends up in one of these.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A text message: a protocol frame to decode.
    Text(Utf8Bytes),
    /// A binary message, which the protocol does not use.
    Binary,
    /// The peer started (or answered) the close handshake.
    Closed(Option<CloseFrame>),
    /// A message over the size limit.
    TooBig(String),
    /// The connection broke, or ended without a close handshake.
    Lost(String),
}

/// The next message of `stream`; cancel-safe.
pub(crate) async fn next_message<S>(stream: &mut S) -> Incoming
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    loop {
        let incoming = match stream.next().await {
            Some(Ok(Message::Text(text))) => Incoming::Text(text),
            Some(Ok(Message::Binary(_))) => Incoming::Binary,
            Some(Ok(Message::Close(frame))) => Incoming::Closed(frame),
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
            Some(Err(WsError::Capacity(error))) => Incoming::TooBig(error.to_string()),
            Some(Err(error)) => Incoming::Lost(error.to_string()),
            None => Incoming::Lost("connection closed".to_owned()),
        };
        return incoming;
    }
}

/// A close frame with `code` and as much of `reason` as fits.
pub(crate) fn close_frame(code: CloseCode, reason: &str) -> CloseFrame {
    CloseFrame {
        code: code.code().into(),
        reason: fit_reason(reason).into(),
    }
}

/// Sends `frame` (or completes a close the peer started) and reads until the peer's close
/// arrives, within `limit`; the socket is done afterwards either way.
pub(crate) async fn finish_close<S>(
    socket: &mut WebSocketStream<S>,
    frame: Option<CloseFrame>,
    limit: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake = async {
        if let Err(error) = socket.close(frame).await {
            tracing::debug!(%error, "sending the close frame failed");
            return;
        }
        for _ in 0..CLOSE_DRAIN_LIMIT {
            if !matches!(socket.next().await, Some(Ok(_))) {
                return;
            }
        }
    };
    if tokio::time::timeout(limit, handshake).await.is_err() {
        tracing::debug!(
            ?limit,
            "the peer did not finish the close handshake in time"
        );
    }
}
