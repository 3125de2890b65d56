//! Turns a panicking handler into a failed task instead of a dead lane.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls `F`, catching a panic in any poll and yielding its message instead.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.get_mut().0;
        // The future is dropped right after a panic and never polled again, so no broken
        // invariant it may hold can be observed.
        match catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(message(payload.as_ref()))),
        }
    }
}

fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_its_message_and_a_value_passes_through() {
        let panicking: Pin<Box<dyn Future<Output = u8> + Send>> =
            Box::pin(async { panic!("handler exploded") });
        assert_eq!(
            CatchUnwind(panicking).await,
            Err("handler exploded".to_owned())
        );
        let fine: Pin<Box<dyn Future<Output = u8> + Send>> = Box::pin(async { 7 });
        assert_eq!(CatchUnwind(fine).await, Ok(7));
    }
}
