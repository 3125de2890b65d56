//! The writer half of a registered worker socket: drains the delivery queue onto the wire.

use futures::SinkExt;
use futures::stream::SplitSink;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::protocol::{self, GatewayFrame};

/// Sends queued frames until `stop` is cancelled or the queue closes, then hands the sink back
/// for the close handshake (the close flushes what was fed). A write error cancels `failed`,
/// which ends the worker socket.
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
            return sink;
        }
    }
    // The socket is closing and core has taken the worker's tasks back, so queued tasks are
    // dropped; a queued drain or cancel still tells the worker something true, ahead of the
    // close frame (a gateway that drains and then closes at once must not lose the drain).
    while let Ok(frame) = queue.try_recv() {
        if !matches!(
            frame,
            GatewayFrame::Drain { .. } | GatewayFrame::Cancel { .. }
        ) {
            continue;
        }
        let Ok(text) = protocol::encode(&frame) else {
            continue;
        };
        if sink.feed(Message::text(text)).await.is_err() {
            return sink;
        }
    }
    // A fed message may still sit in the split sink's own slot, which reuniting the halves
    // would drop: push everything to the socket before handing the sink back.
    if let Err(error) = sink.flush().await {
        tracing::debug!(%error, "flushing the worker socket failed");
    }
    sink
}
