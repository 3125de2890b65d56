//! Outcome watchers: each principal hears the outcomes of its own durable dispatches, through
//! a bounded channel of its own, so a busy principal never makes another one lag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::broadcast;

use super::record::DispatchId;
use crate::outcome::ActivityOutcome;
use crate::registry::shrink_after_drain;

type Announcement = Arc<(DispatchId, ActivityOutcome)>;

/// What an [`OutcomeWatch`] hears next.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchEvent {
    /// The outcome recorded for one of the principal's dispatches.
    Outcome {
        /// The dispatch.
        id: DispatchId,
        /// Its one outcome.
        outcome: ActivityOutcome,
    },
    /// The watcher fell behind by more than its capacity and missed this many outcomes
    /// (read them with `AwaitOutcome` or `GetDispatch`).
    Lagged {
        /// How many outcomes it missed.
        missed: u64,
    },
}

/// The outcomes of one principal's durable dispatches as they are recorded, from
/// [`DurableDispatcher::watch`](super::DurableDispatcher::watch).
#[derive(Debug)]
pub struct OutcomeWatch {
    receiver: broadcast::Receiver<Announcement>,
}

impl OutcomeWatch {
    /// The next event; `None` once the durable dispatcher shut down.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        match self.receiver.recv().await {
            Ok(announced) => {
                let (id, outcome) = &*announced;
                Some(WatchEvent::Outcome {
                    id: id.clone(),
                    outcome: outcome.clone(),
                })
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => Some(WatchEvent::Lagged { missed }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

/// The watchers' channels, one per principal with a watcher.
#[derive(Debug)]
pub(super) struct Watchers {
    capacity: usize,
    /// `None` once closed: new watchers end at once.
    channels: Mutex<Option<HashMap<String, broadcast::Sender<Announcement>>>>,
}

impl Watchers {
    /// Channels holding up to `capacity` outcomes per principal (at least one).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            channels: Mutex::new(Some(HashMap::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<HashMap<String, broadcast::Sender<Announcement>>>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A watcher of `principal`'s outcomes from now on.
    pub(super) fn subscribe(&self, principal: &str) -> OutcomeWatch {
        let mut channels = self.lock();
        let receiver = match channels.as_mut() {
            Some(channels) => {
                // Principals whose watchers all left, and who had no outcome since.
                channels.retain(|_, sender| sender.receiver_count() > 0);
                channels
                    .entry(principal.to_owned())
                    .or_insert_with(|| broadcast::Sender::new(self.capacity))
                    .subscribe()
            }
            // A sender dropped at once: the watch ends on its first read.
            None => broadcast::Sender::new(1).subscribe(),
        };
        OutcomeWatch { receiver }
    }

    /// Tells `principal`'s watchers, if it has any, that `id` ended with `outcome`.
    pub(super) fn announce(&self, principal: &str, id: &DispatchId, outcome: &ActivityOutcome) {
        let mut channels = self.lock();
        let Some(channels) = channels.as_mut() else {
            return;
        };
        let Some(sender) = channels.get(principal) else {
            return;
        };
        if sender.receiver_count() == 0 {
            channels.remove(principal);
            shrink_after_drain(channels);
            return;
        }
        let _ = sender.send(Arc::new((id.clone(), outcome.clone())));
    }

    /// Ends every watcher (they read what is queued, then `None`).
    pub(super) fn close(&self) {
        self.lock().take();
    }
}
