//! The response half of a worker stream: the frames the stream queues (the acknowledgement
//! first), then the closing status once the frames queued before it are out.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use switchyard_proto::v1::GatewayFrame;

/// A frame in a worker's push queue, boxed: a tokio channel allocates its first block of 32
/// slots when it is created, so queuing frames inline (128 bytes each) cost every connected
/// worker 4 KiB before anything was pushed; boxed, the block is 256 bytes.
pub(crate) type QueuedFrame = Box<GatewayFrame>;
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tonic::Status;

/// What the stream tells the response stream.
pub(crate) enum Control {
    /// Registration accepted: send whatever arrives on `frames`, the acknowledgement first.
    Registered { frames: mpsc::Receiver<QueuedFrame> },
    /// End the stream with this status.
    Close(Status),
}

/// How long a closing stream may spend flushing the frames queued before its end; past it the
/// rest is dropped and the end goes out, so a worker that reads slowly cannot hold it forever.
pub(crate) const CLOSE_FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// The response stream of a worker call (`GatewayFrame`s, then the closing status).
///
/// The stream queues the acknowledgement before it announces the worker to core, so nothing
/// core sends can overtake it; before registration only a closing status can flow. The stream
/// ends when the stream
/// says so (a status) or drops its control sender (a clean end). Frames queued before that end
/// go out first, so a worker sees the `drain` or `cancel` that explains it; the flush takes
/// what is already queued (the delivery leg accepts nothing once the stream ends) and at most
/// 5 s, so a worker that reads slowly cannot hold the end forever.
pub struct Outbound {
    control: mpsc::Receiver<Control>,
    frames: Option<mpsc::Receiver<QueuedFrame>>,
    closing: Option<Closing>,
    done: bool,
}

/// An end the stream is flushing towards.
struct Closing {
    /// The status to end with; `None` for a clean end.
    status: Option<Status>,
    flush_until: Pin<Box<Sleep>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("registered", &self.frames.is_some())
            .field("closing", &self.closing.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Outbound {
    /// A response stream and the stream's end of its control channel.
    pub(crate) fn new() -> (Self, mpsc::Sender<Control>) {
        // Two messages at most ever travel: the registration and the closing status.
        let (control, rx) = mpsc::channel(2);
        let stream = Self {
            control: rx,
            frames: None,
            closing: None,
            done: false,
        };
        (stream, control)
    }

    /// The next queued frame while closing, or the end once none is left or the flush limit
    /// passed.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<GatewayFrame, Status>>> {
        let Some(closing) = self.closing.as_mut() else {
            return Poll::Pending;
        };
        let expired = closing.flush_until.as_mut().poll(cx).is_ready();
        if !expired {
            if let Some(Poll::Ready(Some(frame))) =
                self.frames.as_mut().map(|frames| frames.poll_recv(cx))
            {
                return Poll::Ready(Some(Ok(*frame)));
            }
        }
        self.done = true;
        let status = self.closing.take().and_then(|closing| closing.status);
        Poll::Ready(status.map(Err))
    }
}

impl Stream for Outbound {
    type Item = Result<GatewayFrame, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.closing.is_none() {
            // At most two control messages ever travel, so this loop turns at most twice.
            let status = loop {
                match this.control.poll_recv(cx) {
                    Poll::Ready(Some(Control::Registered { frames })) => {
                        this.frames = Some(frames);
                    }
                    Poll::Ready(Some(Control::Close(status))) => break Some(status),
                    Poll::Ready(None) => break None,
                    Poll::Pending => {
                        return match this.frames.as_mut().map(|frames| frames.poll_recv(cx)) {
                            Some(Poll::Ready(Some(frame))) => Poll::Ready(Some(Ok(*frame))),
                            // Every delivery handle is gone; the control channel decides the end.
                            Some(Poll::Ready(None)) | Some(Poll::Pending) | None => Poll::Pending,
                        };
                    }
                }
            };
            this.closing = Some(Closing {
                status,
                flush_until: Box::pin(tokio::time::sleep(CLOSE_FLUSH_LIMIT)),
            });
        }
        this.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use switchyard_proto::v1::{LivenessPing, gateway_frame};

    use super::*;

    fn ping(seq: u64) -> QueuedFrame {
        Box::new(GatewayFrame {
            frame: Some(gateway_frame::Frame::Ping(LivenessPing { seq })),
        })
    }

    #[tokio::test]
    async fn nothing_flows_before_registration_then_the_queue_in_order() {
        let (mut stream, control) = Outbound::new();
        let (tx, rx) = mpsc::channel(4);
        let ack = ping(0);
        tx.try_send(ack.clone()).unwrap();
        tx.try_send(ping(1)).unwrap();
        assert!(futures::poll!(stream.next()).is_pending());
        control
            .send(Control::Registered { frames: rx })
            .await
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), *ack);
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(1));
        drop(control);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn closing_status_ends_the_stream() {
        let (mut stream, control) = Outbound::new();
        control
            .send(Control::Close(Status::invalid_argument("no")))
            .await
            .unwrap();
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.message(), "no");
        assert!(stream.next().await.is_none());
    }

    /// Registers the stream with the acknowledgement, `ping(0)`, queued first on `tx`.
    fn registered(
        stream_control: &mpsc::Sender<Control>,
        tx: &mpsc::Sender<QueuedFrame>,
        frames: mpsc::Receiver<QueuedFrame>,
    ) {
        tx.try_send(ping(0)).unwrap();
        stream_control
            .try_send(Control::Registered { frames })
            .unwrap();
    }

    #[tokio::test]
    async fn queued_frames_go_out_before_the_closing_status() {
        let (mut stream, control) = Outbound::new();
        let (tx, rx) = mpsc::channel(4);
        registered(&control, &tx, rx);
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(0));
        tx.try_send(ping(1)).unwrap();
        tx.try_send(ping(2)).unwrap();
        control
            .try_send(Control::Close(Status::unavailable("bye")))
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(1));
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(2));
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.message(), "bye");
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn a_clean_end_flushes_too() {
        let (mut stream, control) = Outbound::new();
        let (tx, rx) = mpsc::channel(4);
        registered(&control, &tx, rx);
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(0));
        tx.try_send(ping(1)).unwrap();
        drop(control);
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(1));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_flush_is_bounded_by_the_limit() {
        let (mut stream, control) = Outbound::new();
        let (tx, rx) = mpsc::channel(4);
        registered(&control, &tx, rx);
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(0));
        tx.try_send(ping(1)).unwrap();
        tx.try_send(ping(2)).unwrap();
        control
            .try_send(Control::Close(Status::unavailable("bye")))
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), *ping(1));
        // The reader stalls past the limit: what is left is dropped and the status goes out.
        tokio::time::advance(CLOSE_FLUSH_LIMIT + Duration::from_millis(1)).await;
        let status = stream.next().await.unwrap().unwrap_err();
        assert_eq!(status.message(), "bye");
        assert!(stream.next().await.is_none());
    }
}
