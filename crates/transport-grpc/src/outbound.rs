//! The response half of a worker stream: the acknowledgement first, then pushed frames, then
//! the closing status.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use switchyard_proto::v1::GatewayFrame;
use tokio::sync::mpsc;
use tonic::Status;

/// What the session tells the response stream.
pub(crate) enum Control {
    /// Registration accepted: send `ack` first, then whatever arrives on `frames`.
    Registered {
        ack: GatewayFrame,
        frames: mpsc::Receiver<GatewayFrame>,
    },
    /// End the stream with this status.
    Close(Status),
}

/// The response stream of a worker call (`GatewayFrame`s, then the closing status).
///
/// Nothing flows before the session hands over the acknowledgement, so a ping queued by core
/// the instant the worker is admitted can never overtake it. The stream ends when
/// the session says so (a status) or drops its control sender (a clean end); a closing status
/// is sent at once, without waiting behind queued frames, since the stream is going away.
pub struct Outbound {
    control: mpsc::Receiver<Control>,
    frames: Option<mpsc::Receiver<GatewayFrame>>,
    done: bool,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("registered", &self.frames.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Outbound {
    /// A response stream and the session's end of its control channel.
    pub(crate) fn new() -> (Self, mpsc::Sender<Control>) {
        // Two messages at most ever travel: the registration and the closing status.
        let (control, rx) = mpsc::channel(2);
        let stream = Self {
            control: rx,
            frames: None,
            done: false,
        };
        (stream, control)
    }
}

impl Stream for Outbound {
    type Item = Result<GatewayFrame, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match this.control.poll_recv(cx) {
            Poll::Ready(Some(Control::Registered { ack, frames })) => {
                this.frames = Some(frames);
                return Poll::Ready(Some(Ok(ack)));
            }
            Poll::Ready(Some(Control::Close(status))) => {
                this.done = true;
                return Poll::Ready(Some(Err(status)));
            }
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        match this.frames.as_mut().map(|frames| frames.poll_recv(cx)) {
            Some(Poll::Ready(Some(frame))) => Poll::Ready(Some(Ok(frame))),
            // Every delivery handle is gone; the session's control channel decides the end.
            Some(Poll::Ready(None)) | Some(Poll::Pending) | None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use switchyard_proto::v1::{LivenessPing, gateway_frame};

    use super::*;

    fn ping(seq: u64) -> GatewayFrame {
        GatewayFrame {
            frame: Some(gateway_frame::Frame::Ping(LivenessPing { seq })),
        }
    }

    #[tokio::test]
    async fn queued_frames_wait_for_the_acknowledgement() {
        let (mut stream, control) = Outbound::new();
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(ping(1)).unwrap();
        assert!(futures::poll!(stream.next()).is_pending());
        let ack = ping(0);
        control
            .send(Control::Registered {
                ack: ack.clone(),
                frames: rx,
            })
            .await
            .unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap(), ack);
        assert_eq!(stream.next().await.unwrap().unwrap(), ping(1));
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
}
