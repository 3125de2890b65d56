//! A store other processes write to (a cluster's other nodes): `AwaitOutcome` for a dispatch
//! no driver runs here waits on the store, and outcomes recorded elsewhere reach this
//! process's watchers by the same rule (the principal's channel, the same bound).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::address::WorkerId;
use crate::dispatcher::tests::fixture as dispatching;
use crate::durable::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchState, DispatchStore,
    DispatchStoreError, DurableConfig, DurableDispatcher, NewDispatch, OutcomeRecord, OutcomeWatch,
    Recorded, StoredDispatch, WatchEvent,
};
use crate::outcome::ActivityOutcome;

use super::fixture::*;

/// How often [`Peered::await_recorded`] reads the row again.
const POLL: Duration = Duration::from_millis(10);

/// A memory store with peers: the test feeds what they record, and awaits read the row.
#[derive(Debug)]
struct Peered {
    inner: Arc<crate::durable::MemoryDispatchStore>,
    feed: Mutex<Option<mpsc::Receiver<StoredDispatch>>>,
}

#[async_trait::async_trait]
impl DispatchStore for Peered {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        self.inner.record(dispatch).await
    }
    async fn park(&self, id: &DispatchId, reason: &str) -> Result<(), DispatchStoreError> {
        self.inner.park(id, reason).await
    }
    async fn claim(
        &self,
        id: &DispatchId,
        worker: WorkerId,
        attempt: u32,
    ) -> Result<(), DispatchStoreError> {
        self.inner.claim(id, worker, attempt).await
    }
    async fn extend(&self, id: &DispatchId) -> Result<(), DispatchStoreError> {
        self.inner.extend(id).await
    }
    async fn complete(
        &self,
        id: &DispatchId,
        outcome: &OutcomeRecord,
        at: SystemTime,
    ) -> Result<Completion, DispatchStoreError> {
        self.inner.complete(id, outcome, at).await
    }
    async fn release(&self, id: &DispatchId, delay: Duration) -> Result<(), DispatchStoreError> {
        self.inner.release(id, delay).await
    }
    async fn unfinished(&self) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.inner.unfinished().await
    }
    async fn get(&self, id: &DispatchId) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        self.inner.get(id).await
    }
    async fn list(
        &self,
        filter: &DispatchFilter,
    ) -> Result<Vec<StoredDispatch>, DispatchStoreError> {
        self.inner.list(filter).await
    }
    async fn census(&self, now: SystemTime) -> Result<Vec<BacklogCensus>, DispatchStoreError> {
        self.inner.census(now).await
    }
    async fn purge(&self, before: SystemTime) -> Result<u64, DispatchStoreError> {
        self.inner.purge(before).await
    }
    async fn await_recorded(
        &self,
        id: &DispatchId,
        wait: Duration,
    ) -> Result<Option<StoredDispatch>, DispatchStoreError> {
        let finished = async {
            loop {
                if let Some(row) = self.inner.get(id).await?
                    && matches!(row.state, DispatchState::Finished { .. })
                {
                    return Ok(row);
                }
                tokio::time::sleep(POLL).await;
            }
        };
        match tokio::time::timeout(wait, finished).await {
            Ok(row) => row.map(Some),
            Err(_) => Ok(None),
        }
    }
    fn recorded_elsewhere(&self) -> Option<mpsc::Receiver<StoredDispatch>> {
        self.feed.lock().expect("not poisoned").take()
    }
}

/// A durable dispatcher over a peered memory store: the store, the feed of its peers'
/// outcomes, and the dispatcher.
async fn peered(
    watch_capacity: usize,
) -> (
    Arc<crate::durable::MemoryDispatchStore>,
    mpsc::Sender<StoredDispatch>,
    DurableDispatcher,
) {
    let inner = memory();
    let (feed, heard) = mpsc::channel(16);
    let store = Arc::new(Peered {
        inner: Arc::clone(&inner),
        feed: Mutex::new(Some(heard)),
    });
    let config = DurableConfig {
        watch_capacity,
        ..DurableConfig::default()
    };
    let durable = DurableDispatcher::start(dispatching::setup().dispatcher, store, config)
        .await
        .expect("the memory store reads");
    (inner, feed, durable)
}

/// A dispatch of `principal`'s as another process recorded it, ended with `text`.
fn finished_elsewhere(principal: &str, text: &str) -> StoredDispatch {
    let now = SystemTime::now();
    StoredDispatch {
        dispatch: new_dispatch(principal),
        state: DispatchState::Finished {
            outcome: OutcomeRecord::from(&ActivityOutcome::Completed(Bytes::from(text.to_owned()))),
            at: now,
        },
        attempts: 1,
    }
}

fn new_dispatch(principal: &str) -> NewDispatch {
    let now = SystemTime::now();
    NewDispatch {
        id: DispatchId::generate(),
        namespace: NS.to_owned(),
        task_queue: "default".to_owned(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: Bytes::new(),
        principal: principal.to_owned(),
        idempotency_key: None,
        submitted_at: now,
        deadline: now + Duration::from_secs(60),
    }
}

/// The watch's next event; `None` when none comes within a minute (of paused time).
async fn next(watch: &mut OutcomeWatch) -> Option<WatchEvent> {
    tokio::time::timeout(Duration::from_secs(60), watch.next())
        .await
        .ok()
        .flatten()
}

fn completed_with(text: &str) -> ActivityOutcome {
    ActivityOutcome::Completed(Bytes::from(text.to_owned()))
}

fn heard(row: &StoredDispatch, text: &str) -> Option<WatchEvent> {
    Some(WatchEvent::Outcome {
        id: row.dispatch.id.clone(),
        outcome: ActivityOutcome::Completed(Bytes::from(text.to_owned())),
    })
}

#[tokio::test(start_paused = true)]
async fn outcomes_recorded_elsewhere_reach_their_principals_watchers_within_the_same_bound() {
    let (_store, feed, durable) = peered(2).await;
    let (alice, bob) = (producer("alice"), producer("bob"));
    let (mut on_alice, mut on_bob) = (durable.watch(&alice), durable.watch(&bob));
    let alices = finished_elsewhere("alice", "a1");
    feed.send(alices.clone()).await.unwrap();
    assert_eq!(next(&mut on_alice).await, heard(&alices, "a1"));
    // Control: bob hears none of alice's; his next is his own.
    let bobs = finished_elsewhere("bob", "b1");
    feed.send(bobs.clone()).await.unwrap();
    assert_eq!(next(&mut on_bob).await, heard(&bobs, "b1"));
    // Four more than alice reads, with room for two: told she missed two, then the last two.
    let more: Vec<_> = (0..4)
        .map(|n| finished_elsewhere("alice", &format!("a{n}")))
        .collect();
    for row in &more {
        feed.send(row.clone()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        next(&mut on_alice).await,
        Some(WatchEvent::Lagged { missed: 2 })
    );
    assert_eq!(next(&mut on_alice).await, heard(&more[2], "a2"));
    assert_eq!(next(&mut on_alice).await, heard(&more[3], "a3"));
}

#[tokio::test(start_paused = true)]
async fn await_outcome_for_a_dispatch_driven_elsewhere_waits_for_the_store_to_record_it() {
    let (store, _feed, durable) = peered(8).await;
    let alice = producer("alice");
    // Recorded by "another process": no driver runs it here.
    let elsewhere = new_dispatch("alice");
    let id = elsewhere.id.clone();
    store.record(elsewhere).await.unwrap();
    let finishing = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let done = OutcomeRecord::from(&completed_with("done"));
        store.complete(&id, &done, SystemTime::now()).await
    };
    let (heard, _) = tokio::join!(
        durable.await_outcome(&alice, &id, Duration::from_secs(60)),
        finishing
    );
    assert_eq!(heard, Ok(Some(completed_with("done"))));
    // Control: one nobody finishes is pending at the end of the wait.
    let open = new_dispatch("alice");
    let open_id = open.id.clone();
    store.record(open).await.unwrap();
    assert_eq!(
        durable
            .await_outcome(&alice, &open_id, Duration::from_secs(1))
            .await,
        Ok(None)
    );
}
