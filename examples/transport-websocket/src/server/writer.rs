//! The writer half of a registered worker socket: drains the delivery queue onto the wire.

use futures::SinkExt;
use futures::stream::SplitSink;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, GatewayFrame};

/// Sends queued frames until `stop` is cancelled or the queue closes, then hands the sink back
/// for the close handshake. A write error cancels `failed`, which ends the session.
///
/// Frames are written without a flush while more are queued and flushed once the queue is
/// empty, so a burst of tasks costs one flush, not one per task.
pub(super) async fn run<S>(
    mut sink: SplitSink<WebSocketStream<S>, Message>,
    mut queue: mpsc::Receiver<GatewayFrame>,
    stop: CancellationToken,
    failed: CancellationToken,
) -> SplitSink<WebSocketStream<S>, Message>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let frame = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            frame = queue.recv() => match frame {
                Some(frame) => frame,
                None => break,
            },
        };
        let text = match protocol::encode(&frame) {
            Ok(text) => text,
            Err(error) => {
                tracing::error!(%error, "a gateway frame failed to encode; dropped");
                continue;
            }
        };
        let message = Message::text(text);
        let written = if queue.is_empty() {
            sink.send(message).await
        } else {
            sink.feed(message).await
        };
        if let Err(error) = written {
            tracing::debug!(%error, "writing to the worker socket failed");
            failed.cancel();
            break;
        }
    }
    sink
}
