//! [`IdleTimeout`]: a connection that moves no byte either way for a while fails its next read
//! or write, so a peer that stops reading or writing gives back its place.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `io` that fails with `TimedOut` once `idle` passes without a byte read or written.
#[derive(Debug)]
pub(crate) struct IdleTimeout<IO> {
    io: IO,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> IdleTimeout<IO> {
    pub(crate) fn new(io: IO, idle: Duration) -> Self {
        Self {
            io,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn moved(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// `Pending` until the deadline, then the error that ends the connection.
    fn expired<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "ops.idle_timeout reached",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleTimeout<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.expired(cx),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(result) => {
                if matches!(result, Ok(n) if n > 0) {
                    self.moved();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.expired(cx),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Pending => self.expired(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_times_out_and_a_talking_one_does_not() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut conn = IdleTimeout::new(near, Duration::from_secs(5));
        let mut byte = [0u8; 1];
        // Bytes every 4 s keep it open past the 5 s idle limit.
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(4)).await;
            far.write_all(b"x").await.unwrap();
            assert_eq!(conn.read(&mut byte).await.unwrap(), 1);
        }
        // Then silence: the next read fails once 5 s have passed.
        let started = Instant::now();
        let error = conn.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
