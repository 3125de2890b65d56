//! Outcomes as the outcomes bucket records them, heard by one watch of the bucket per node:
//! they end the `AwaitOutcome` calls waiting on this node for a dispatch another node drives,
//! and those another node recorded go to this node's outcome watchers.
//!
//! The watch resumes from the revision after the last one it saw when it breaks (NATS
//! restarted), so an outcome recorded meanwhile is heard late rather than missed, unless the
//! retention loop purged it first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use switchyard_core::{DispatchId, StoredDispatch};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::codec::decode;

/// How long a broken watch of the outcomes bucket waits before it watches again.
const REWATCH_AFTER: Duration = Duration::from_secs(1);

/// Outcomes the feed hands to the durable dispatcher's watchers before a slow reader holds it
/// up (the watchers' own bound, per principal, applies after it).
const ELSEWHERE_CAPACITY: usize = 1024;

/// The calls waiting on this node for one dispatch's outcome, by id.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    waiting: Mutex<HashMap<DispatchId, watch::Sender<Option<StoredDispatch>>>>,
}

impl Waiters {
    fn lock(&self) -> MutexGuard<'_, HashMap<DispatchId, watch::Sender<Option<StoredDispatch>>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hears `id`'s finished row once [`finish`](Self::finish) is called for it.
    pub(super) fn subscribe(&self, id: &DispatchId) -> watch::Receiver<Option<StoredDispatch>> {
        self.lock()
            .entry(id.clone())
            .or_insert_with(|| watch::Sender::new(None))
            .subscribe()
    }

    /// Hands `row` (finished) to the calls waiting for it.
    pub(super) fn finish(&self, row: &StoredDispatch) {
        let waiting = self.lock().remove(&row.dispatch.id);
        if let Some(sender) = waiting {
            sender.send_replace(Some(row.clone()));
        }
    }

    /// Stops tracking `id` once no call waits for it any more.
    pub(super) fn forget(&self, id: &DispatchId) {
        let mut waiting = self.lock();
        if waiting.get(id).is_some_and(|s| s.receiver_count() == 0) {
            waiting.remove(id);
        }
    }

    /// How many dispatches have a call waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One node's watch of the outcomes bucket, stopped when dropped.
#[derive(Debug)]
pub(super) struct Feed {
    pub(super) waiters: Arc<Waiters>,
    elsewhere: Arc<Mutex<Option<mpsc::Sender<StoredDispatch>>>>,
    _stop: DropGuard,
}

impl Feed {
    /// Starts watching `outcomes` as `node`, from revision `from` on.
    pub(super) fn start(outcomes: kv::Store, node: String, from: u64) -> Self {
        let waiters = Arc::new(Waiters::default());
        let elsewhere = Arc::new(Mutex::new(None));
        let stop = CancellationToken::new();
        tokio::spawn(watch_outcomes(
            outcomes,
            node,
            from,
            Arc::clone(&waiters),
            Arc::clone(&elsewhere),
            stop.clone(),
        ));
        Self {
            waiters,
            elsewhere,
            _stop: stop.drop_guard(),
        }
    }

    /// The outcomes other nodes record from now on (replacing an earlier receiver).
    pub(super) fn elsewhere(&self) -> mpsc::Receiver<StoredDispatch> {
        let (sender, receiver) = mpsc::channel(ELSEWHERE_CAPACITY);
        *self
            .elsewhere
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(sender);
        receiver
    }
}

async fn watch_outcomes(
    outcomes: kv::Store,
    node: String,
    mut next_revision: u64,
    waiters: Arc<Waiters>,
    elsewhere: Arc<Mutex<Option<mpsc::Sender<StoredDispatch>>>>,
    stop: CancellationToken,
) {
    loop {
        let watched = outcomes.watch_all_from_revision(next_revision).await;
        match watched {
            Ok(mut entries) => loop {
                let entry = tokio::select! {
                    () = stop.cancelled() => return,
                    entry = entries.next() => entry,
                };
                let entry = match entry {
                    Some(Ok(entry)) => entry,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "cluster: the outcomes watch broke");
                        break;
                    }
                    None => break,
                };
                next_revision = entry.revision.saturating_add(1);
                if entry.operation != kv::Operation::Put {
                    continue;
                }
                let row = match decode(&entry.value) {
                    Ok(row) => row,
                    Err(problem) => {
                        tracing::warn!(key = %entry.key, %problem, "skipping an unreadable outcome");
                        continue;
                    }
                };
                waiters.finish(&row.stored);
                if row.owner == node {
                    // This node's watchers heard it from the driver that recorded it.
                    continue;
                }
                let sender = elsewhere
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                if let Some(sender) = sender {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = sender.send(row.stored) => {}
                    }
                }
            },
            Err(error) => tracing::debug!(%error, "cluster: cannot watch the outcomes bucket"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REWATCH_AFTER) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use bytes::Bytes;
    use switchyard_core::{DispatchState, NewDispatch, OutcomeRecord};

    use super::*;

    fn finished(id: &DispatchId) -> StoredDispatch {
        let now = SystemTime::now();
        StoredDispatch {
            dispatch: NewDispatch {
                id: id.clone(),
                namespace: "ns".to_owned(),
                task_queue: "default".to_owned(),
                activity_type: "echo".to_owned(),
                node: None,
                input: Bytes::new(),
                principal: "shop".to_owned(),
                idempotency_key: None,
                submitted_at: now,
                deadline: now,
            },
            state: DispatchState::Finished {
                outcome: OutcomeRecord::from(&switchyard_core::ActivityOutcome::Cancelled),
                at: now,
            },
            attempts: 0,
        }
    }

    #[test]
    fn a_finished_row_reaches_every_call_waiting_for_its_id_and_no_other() {
        let waiters = Waiters::default();
        let (id, other) = (DispatchId::generate(), DispatchId::generate());
        let (first, second) = (waiters.subscribe(&id), waiters.subscribe(&id));
        let unrelated = waiters.subscribe(&other);
        waiters.finish(&finished(&id));
        assert_eq!(first.borrow().as_ref().map(|r| &r.dispatch.id), Some(&id));
        assert_eq!(second.borrow().as_ref().map(|r| &r.dispatch.id), Some(&id));
        // Control: a call waiting for another dispatch hears nothing.
        assert!(unrelated.borrow().is_none());
        assert_eq!(waiters.len(), 1, "the finished id is no longer tracked");
    }

    #[test]
    fn an_id_is_forgotten_only_once_no_call_waits_for_it() {
        let waiters = Waiters::default();
        let id = DispatchId::generate();
        let (first, second) = (waiters.subscribe(&id), waiters.subscribe(&id));
        drop(first);
        waiters.forget(&id);
        assert_eq!(waiters.len(), 1, "one call still waits");
        drop(second);
        waiters.forget(&id);
        assert_eq!(waiters.len(), 0);
    }
}
