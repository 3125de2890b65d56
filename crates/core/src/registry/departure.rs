//! How a transport learns that core let its worker go, and why.

use tokio::sync::watch;

use crate::events::DisconnectReason;

/// Resolves when core deregisters one worker, with the reason; cheap to clone.
///
/// Core sets it on its one deregistration path (the token, a liveness timeout, a drain of a
/// leg with no drain channel, a leg found closed), so a transport needs no map of its own from
/// worker to connection. It is race-free: asked after the worker left, it resolves at once.
#[derive(Clone, Debug)]
pub struct Departure {
    reason: watch::Receiver<Option<DisconnectReason>>,
}

/// Core's end of a [`Departure`], kept with the registered worker.
#[derive(Debug)]
pub(crate) struct DepartureSender(watch::Sender<Option<DisconnectReason>>);

impl DepartureSender {
    /// Records `reason` and wakes every waiter; only the first reason counts.
    pub(crate) fn depart(&self, reason: DisconnectReason) {
        self.0.send_if_modified(|current| {
            let first = current.is_none();
            if first {
                *current = Some(reason);
            }
            first
        });
    }
}

/// A new worker's departure pair: core keeps the sender, the token hands out the receiver.
pub(crate) fn departure() -> (DepartureSender, Departure) {
    let (sender, reason) = watch::channel(None);
    (DepartureSender(sender), Departure { reason })
}

impl Departure {
    /// Waits until core lets the worker go and returns why.
    ///
    /// Cancel-safe: dropping the future loses nothing, so it can sit in a `select!` loop.
    pub async fn departed(&self) -> DisconnectReason {
        let mut reason = self.reason.clone();
        let settled = reason.wait_for(Option::is_some).await.map(|seen| *seen);
        // The sender lives until the worker leaves, and leaving sets a reason first; a sender
        // gone without one can only mean the registry itself is gone, which lets go of all.
        settled
            .ok()
            .flatten()
            .unwrap_or(DisconnectReason::Disconnect)
    }

    /// Why the worker left, if it has.
    pub fn reason(&self) -> Option<DisconnectReason> {
        *self.reason.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_reason_wins_and_late_callers_see_it_at_once() {
        let (sender, departure) = departure();
        assert_eq!(departure.reason(), None);
        let waiting = tokio::spawn({
            let departure = departure.clone();
            async move { departure.departed().await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "nothing resolves before the worker leaves"
        );
        sender.depart(DisconnectReason::Timeout);
        sender.depart(DisconnectReason::Drained);
        assert_eq!(waiting.await.ok(), Some(DisconnectReason::Timeout));
        assert_eq!(departure.departed().await, DisconnectReason::Timeout);
    }
}
