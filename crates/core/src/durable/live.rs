//! The durable dispatches this process is running: their cancel handles, where they stand in
//! memory (ahead of the store's row) and the one outcome their waiters wait for.
//!
//! A waiter holds a one-shot receiver of its own, not the [`Live`]: the dispatch's end sends it
//! the outcome, or drops it (the wait ends with nothing) when there is none to send (the
//! driver stopped, the dispatcher shut down, or the entry was dropped with its driver).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::record::{DispatchId, DispatchState};
use crate::id_hash::IdMap;
use crate::outcome::ActivityOutcome;
use crate::registry::shrink_after_drain;

/// What a [`Live`] dispatch's end changes, under one lock.
#[derive(Debug, Default)]
struct Ending {
    /// Parked or running, as the driver last heard from the dispatcher.
    state: Option<DispatchState>,
    /// The recorded outcome, once there is one.
    outcome: Option<ActivityOutcome>,
    /// Waiting for the outcome.
    waiters: Vec<oneshot::Sender<ActivityOutcome>>,
    /// No waiter waits any more: the dispatch ended without an outcome here, or the dispatcher
    /// shut down.
    closed: bool,
}

/// One durable dispatch with a driver in this process.
#[derive(Debug)]
pub(super) struct Live {
    /// Fired by a cancel: the dispatch ends `Cancelled`.
    pub(super) cancel: CancellationToken,
    /// The submitting principal, who may see it (with the namespace's operators).
    pub(super) principal: String,
    /// Its namespace.
    pub(super) namespace: String,
    ending: Mutex<Ending>,
}

impl Live {
    fn new(principal: String, namespace: String) -> Self {
        Self {
            cancel: CancellationToken::new(),
            principal,
            namespace,
            ending: Mutex::new(Ending::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ending> {
        self.ending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes where the dispatch stands now.
    pub(super) fn set_state(&self, state: DispatchState) {
        self.lock().state = Some(state);
    }

    /// Where the dispatch stands, if the dispatcher said anything yet.
    pub(super) fn state(&self) -> Option<DispatchState> {
        self.lock().state.clone()
    }

    /// Hears the recorded outcome: at once when there is one already; an error (nothing to
    /// hear) once the dispatch ended without one here or the waits were closed.
    pub(super) fn outcome(&self) -> oneshot::Receiver<ActivityOutcome> {
        let (tell, hear) = oneshot::channel();
        let mut ending = self.lock();
        if let Some(outcome) = &ending.outcome {
            let _ = tell.send(outcome.clone());
        } else if !ending.closed {
            ending.waiters.push(tell);
        }
        hear
    }

    /// Hands `outcome` (`None`: none recorded here) to every waiter, and to later ones.
    fn end(&self, outcome: Option<ActivityOutcome>) {
        let waiters = {
            let mut ending = self.lock();
            ending.closed = true;
            ending.outcome.clone_from(&outcome);
            std::mem::take(&mut ending.waiters)
        };
        if let Some(outcome) = outcome {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
        }
    }

    /// Ends every wait without an outcome (the dispatch itself runs on).
    fn close_waits(&self) {
        let waiters = {
            let mut ending = self.lock();
            ending.closed = true;
            std::mem::take(&mut ending.waiters)
        };
        drop(waiters);
    }
}

/// Every [`Live`] dispatch by id.
///
/// Hashed as ids the gateway numbers: every key was generated here (random bits after the
/// time), and an id a peer sends only looks one up.
#[derive(Debug, Default)]
pub(super) struct LiveBook {
    live: Mutex<IdMap<DispatchId, Arc<Live>>>,
}

impl LiveBook {
    fn lock(&self) -> MutexGuard<'_, IdMap<DispatchId, Arc<Live>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts tracking `id`, submitted by `principal` in `namespace` (before its driver runs,
    /// so a cancel never misses it).
    pub(super) fn insert(&self, id: DispatchId, principal: &str, namespace: &str) -> Arc<Live> {
        let live = Arc::new(Live::new(principal.to_owned(), namespace.to_owned()));
        self.lock().insert(id, Arc::clone(&live));
        live
    }

    /// The live dispatch `id`, if a driver runs it here.
    pub(super) fn get(&self, id: &DispatchId) -> Option<Arc<Live>> {
        self.lock().get(id).cloned()
    }

    /// Hands the recorded `outcome` (`None`: none recorded, the driver stopped) to `id`'s
    /// waiters and stops tracking it.
    pub(super) fn finish(&self, id: &DispatchId, outcome: Option<ActivityOutcome>) {
        let live = {
            let mut book = self.lock();
            let live = book.remove(id);
            shrink_after_drain(&mut book);
            live
        };
        if let Some(live) = live {
            live.end(outcome);
        }
    }

    /// Ends every wait on every dispatch tracked now without an outcome (at shutdown: waiters
    /// stop waiting, the dispatches run on).
    pub(super) fn close_waits(&self) {
        let live: Vec<_> = self.lock().values().cloned().collect();
        for live in live {
            live.close_waits();
        }
    }

    /// How many dispatches run here.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> DispatchId {
        DispatchId::parse(&format!("{n:032x}")).expect("id")
    }

    #[test]
    fn every_waiter_before_and_after_the_end_hears_the_one_outcome() {
        let book = LiveBook::default();
        let live = book.insert(id(1), "p", "ns");
        let (mut first, mut second) = (live.outcome(), live.outcome());
        assert!(first.try_recv().is_err(), "nothing before the end");
        book.finish(&id(1), Some(ActivityOutcome::Cancelled));
        assert_eq!(first.try_recv().ok(), Some(ActivityOutcome::Cancelled));
        assert_eq!(second.try_recv().ok(), Some(ActivityOutcome::Cancelled));
        // A waiter that held the entry across the end still hears it.
        assert_eq!(
            live.outcome().try_recv().ok(),
            Some(ActivityOutcome::Cancelled)
        );
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn an_end_without_an_outcome_or_closed_waits_end_the_waits_with_nothing() {
        let book = LiveBook::default();
        let stopped = book.insert(id(1), "p", "ns");
        let mut waiting = stopped.outcome();
        book.finish(&id(1), None);
        assert_eq!(
            waiting.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        assert_eq!(
            stopped.outcome().try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );

        let running = book.insert(id(2), "p", "ns");
        let mut before = running.outcome();
        book.close_waits();
        assert_eq!(before.try_recv(), Err(oneshot::error::TryRecvError::Closed));
        assert_eq!(
            running.outcome().try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        assert_eq!(book.len(), 1, "the dispatch itself runs on");

        // Control: a dispatch whose waits are open keeps its waiter waiting.
        let open = book.insert(id(3), "p", "ns");
        let mut waits = open.outcome();
        assert_eq!(waits.try_recv(), Err(oneshot::error::TryRecvError::Empty));
    }

    #[test]
    fn dropping_the_entry_with_its_driver_ends_the_waits() {
        let book = LiveBook::default();
        let live = book.insert(id(1), "p", "ns");
        let mut waiting = live.outcome();
        drop(live);
        assert_eq!(waiting.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        // The book held the last handle: a driver dropped unrun leaves nothing to wait on.
        drop(book);
        assert_eq!(
            waiting.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
    }
}
