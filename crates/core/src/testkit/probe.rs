//! Worker-side observation: wraps a check's handler to count what the worker really ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::handler::{Handler, TaskCall};

/// Counts, on the worker side, the handlers running, the most ever running at once, the calls
/// made and the cancels that reached a handler.
#[derive(Clone)]
pub(crate) struct Probe {
    inner: Arc<ProbeInner>,
}

struct ProbeInner {
    running: AtomicUsize,
    peak: watch::Sender<usize>,
    calls: watch::Sender<usize>,
    cancels_seen: watch::Sender<usize>,
}

/// Decrements the running count when a handler ends, however it ends.
struct Running<'a>(&'a ProbeInner);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Probe {
    pub(crate) fn new() -> Self {
        Self {
            inner: Arc::new(ProbeInner {
                running: AtomicUsize::new(0),
                peak: watch::Sender::new(0),
                calls: watch::Sender::new(0),
                cancels_seen: watch::Sender::new(0),
            }),
        }
    }

    /// `handler`, observed by this probe.
    pub(crate) fn wrap(&self, handler: Handler) -> Handler {
        let probe = self.clone();
        Handler::new(move |call: TaskCall| {
            let probe = probe.clone();
            let handler = handler.clone();
            async move {
                let inner = &*probe.inner;
                let now = inner.running.fetch_add(1, Ordering::AcqRel) + 1;
                let _running = Running(inner);
                inner.peak.send_if_modified(|peak| {
                    let raised = now > *peak;
                    *peak = (*peak).max(now);
                    raised
                });
                inner.calls.send_modify(|calls| *calls += 1);
                let cancelled = call.cancelled.clone();
                let result = handler.call(call).await;
                if cancelled.is_cancelled() {
                    inner.cancels_seen.send_modify(|seen| *seen += 1);
                }
                result
            }
        })
    }

    /// The most handlers ever running at once.
    pub(crate) fn peak(&self) -> usize {
        *self.inner.peak.borrow()
    }

    /// Handler calls so far.
    pub(crate) fn calls(&self) -> usize {
        *self.inner.calls.borrow()
    }

    /// Waits until the peak reaches `n`; false if `limit` passes first.
    pub(crate) async fn peak_reaches(&self, n: usize, limit: Duration) -> bool {
        reach(&self.inner.peak, n, limit).await
    }

    /// Waits until `n` calls were made; false if `limit` passes first.
    pub(crate) async fn calls_reach(&self, n: usize, limit: Duration) -> bool {
        reach(&self.inner.calls, n, limit).await
    }

    /// Waits until `n` cancels reached a handler; false if `limit` passes first.
    pub(crate) async fn cancels_reach(&self, n: usize, limit: Duration) -> bool {
        reach(&self.inner.cancels_seen, n, limit).await
    }
}

async fn reach(counter: &watch::Sender<usize>, n: usize, limit: Duration) -> bool {
    let mut watch = counter.subscribe();
    matches!(
        tokio::time::timeout(limit, watch.wait_for(|value| *value >= n)).await,
        Ok(Ok(_))
    )
}
