//! A wake-up subscription that cannot miss a wake fired between taking it and awaiting it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// Resolves once something that might make a parked selection succeed has happened since it
/// was created: a registration, a capacity announcement, a freed slot, or a verdict publication.
///
/// Take it *before* reading the registry and await it *after* a miss: `Notify::notify_waiters`
/// stores no permit, but a future created (and enabled) before the notification observes it.
#[must_use = "a subscription only helps if it is awaited after the registry read"]
pub struct WorkerArrival {
    notified: Pin<Box<OwnedNotified>>,
}

impl WorkerArrival {
    pub(crate) fn new(notify: Arc<Notify>) -> Self {
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        Self { notified }
    }
}

impl std::fmt::Debug for WorkerArrival {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerArrival").finish_non_exhaustive()
    }
}

impl Future for WorkerArrival {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().notified.as_mut().poll(cx)
    }
}
