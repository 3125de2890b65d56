//! The durable dispatches this process is running: their cancel handles, where they stand in
//! memory (ahead of the store's row) and the one outcome their waiters wait for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::record::{DispatchId, DispatchState};
use crate::outcome::ActivityOutcome;
use crate::registry::shrink_after_drain;

/// One durable dispatch with a driver in this process.
#[derive(Debug)]
pub(super) struct Live {
    /// Fired by a cancel: the dispatch ends `Cancelled`.
    pub(super) cancel: CancellationToken,
    /// The submitting principal, who may see it (with the namespace's operators).
    pub(super) principal: String,
    /// Its namespace.
    pub(super) namespace: String,
    /// Parked or running, as the driver last heard from the dispatcher.
    state: Mutex<Option<DispatchState>>,
    /// The recorded outcome, once there is one.
    outcome: watch::Sender<Option<ActivityOutcome>>,
}

impl Live {
    fn new(principal: String, namespace: String) -> Self {
        Self {
            cancel: CancellationToken::new(),
            principal,
            namespace,
            state: Mutex::new(None),
            outcome: watch::Sender::new(None),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, Option<DispatchState>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes where the dispatch stands now.
    pub(super) fn set_state(&self, state: DispatchState) {
        *self.lock_state() = Some(state);
    }

    /// Where the dispatch stands, if the dispatcher said anything yet.
    pub(super) fn state(&self) -> Option<DispatchState> {
        self.lock_state().clone()
    }

    /// Hears the recorded outcome (the current value is `None` until there is one).
    pub(super) fn outcome(&self) -> watch::Receiver<Option<ActivityOutcome>> {
        self.outcome.subscribe()
    }
}

/// Every [`Live`] dispatch by id.
#[derive(Debug, Default)]
pub(super) struct LiveBook {
    live: Mutex<HashMap<DispatchId, Arc<Live>>>,
}

impl LiveBook {
    fn lock(&self) -> MutexGuard<'_, HashMap<DispatchId, Arc<Live>>> {
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
        if let (Some(live), Some(outcome)) = (live, outcome) {
            live.outcome.send_replace(Some(outcome));
        }
    }

    /// How many dispatches run here.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}
