//! What a durable dispatch's hooks tell its driver (parked, delivered), queued in order for
//! the driver to write to the store.
//!
//! The hooks run inside the dispatcher on the driver's own task, so the driver's loop, which
//! polls the dispatch before it looks at the queue, usually finds a note in the same pass; the
//! notify covers a hook called from elsewhere. A queue and a notify, not a channel: one shared
//! allocation and a queue that grows with the notes, not a channel's block of slots per
//! dispatch that is delivered once.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::record::DispatchState;
use crate::address::WorkerId;
use crate::registry::UnservedReason;

/// What the dispatcher told the driver, to write to the store in order.
#[derive(Debug)]
pub(super) enum Note {
    Parked(UnservedReason),
    Delivered(WorkerId, u32),
}

impl Note {
    /// Where the note says the dispatch stands.
    pub(super) fn state(&self) -> DispatchState {
        match self {
            Self::Parked(reason) => DispatchState::Parked {
                reason: reason.as_str().to_owned(),
            },
            Self::Delivered(worker, attempt) => DispatchState::Running {
                worker: *worker,
                attempt: *attempt,
            },
        }
    }
}

/// The notes of one dispatch not yet taken by its driver.
#[derive(Debug, Default)]
pub(super) struct Notes {
    queue: Mutex<VecDeque<Note>>,
    added: Notify,
}

impl Notes {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Note>> {
        // A queue, consistent after any panic.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `note` behind the others and wakes the driver.
    pub(super) fn push(&self, note: Note) {
        self.lock().push_back(note);
        self.added.notify_one();
    }

    /// The oldest note, if any, without waiting.
    pub(super) fn try_next(&self) -> Option<Note> {
        self.lock().pop_front()
    }

    /// Empties the queue; the last delivery among what it held, if any.
    pub(super) fn take_last_delivered(&self) -> Option<Note> {
        self.lock()
            .drain(..)
            .rev()
            .find(|note| matches!(note, Note::Delivered(..)))
    }

    /// The oldest note, waiting for one.
    pub(super) async fn next(&self) -> Note {
        loop {
            if let Some(note) = self.try_next() {
                return note;
            }
            self.added.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn delivered(note: &Note) -> Option<u32> {
        match note {
            Note::Delivered(_, attempt) => Some(*attempt),
            Note::Parked(_) => None,
        }
    }

    #[tokio::test]
    async fn notes_come_out_in_the_order_they_were_queued_and_a_waiting_driver_is_woken() {
        let notes = Notes::default();
        assert!(notes.try_next().is_none(), "control: nothing queued yet");
        notes.push(Note::Parked(UnservedReason::NoWorkers));
        notes.push(Note::Delivered(WorkerId::from_raw(1), 1));
        notes.push(Note::Delivered(WorkerId::from_raw(2), 2));
        assert!(matches!(notes.next().await, Note::Parked(_)));
        assert_eq!(notes.try_next().as_ref().and_then(delivered), Some(1));
        assert_eq!(delivered(&notes.next().await), Some(2));
        assert!(notes.try_next().is_none());

        // A note pushed from another task while the driver waits wakes it.
        let notes = Arc::new(Notes::default());
        let waiting = tokio::spawn({
            let notes = Arc::clone(&notes);
            async move { delivered(&notes.next().await) }
        });
        tokio::task::yield_now().await;
        notes.push(Note::Delivered(WorkerId::from_raw(3), 4));
        let woken = tokio::time::timeout(std::time::Duration::from_secs(10), waiting).await;
        assert_eq!(woken.expect("woken").expect("joined"), Some(4));
    }

    #[test]
    fn the_last_delivery_is_taken_and_the_queue_emptied() {
        let notes = Notes::default();
        notes.push(Note::Delivered(WorkerId::from_raw(1), 1));
        notes.push(Note::Delivered(WorkerId::from_raw(2), 2));
        notes.push(Note::Parked(UnservedReason::NoWorkers));
        assert_eq!(
            notes.take_last_delivered().as_ref().and_then(delivered),
            Some(2)
        );
        assert!(notes.try_next().is_none(), "the queue is emptied");
        // Control: parks alone give no delivery.
        notes.push(Note::Parked(UnservedReason::NoWorkers));
        assert!(notes.take_last_delivered().is_none());
    }
}
