//! A durable dispatch without an idempotency key is delivered while its record commits; its
//! outcome waits for the record, and a refused record cancels it. A submission runs nothing
//! before its record commits.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

use crate::address::WorkerId;
use crate::delivery::{CancelReason, WorkerMessage};
use crate::dispatcher::tests::fixture;
use crate::durable::{
    BacklogCensus, Completion, DispatchFilter, DispatchId, DispatchStore, DispatchStoreError,
    DurableConfig, DurableDispatcher, MemoryDispatchStore, NewDispatch, OutcomeRecord, Recorded,
    StoredDispatch, SubmitError,
};

use super::fixture::*;

/// A memory store whose `record` returns only once its commit is let through, as a store
/// whose writer is still committing: the row is written at once (in call order), the answer
/// waits.
#[derive(Debug)]
struct Committing {
    inner: Arc<MemoryDispatchStore>,
    ordered: bool,
    /// Closed (no permits) until the test lets commits through.
    commit: Arc<Semaphore>,
    refuse: Option<DispatchStoreError>,
    /// What every `complete` answers instead of writing, when set: a failing store.
    refuse_complete: Option<DispatchStoreError>,
}

#[async_trait::async_trait]
impl DispatchStore for Committing {
    async fn record(&self, dispatch: NewDispatch) -> Result<Recorded, DispatchStoreError> {
        let recorded = match &self.refuse {
            Some(refusal) => Err(refusal.clone()),
            None => self.inner.record(dispatch).await,
        };
        let _committed = self.commit.acquire().await;
        recorded
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
        if let Some(refusal) = &self.refuse_complete {
            return Err(refusal.clone());
        }
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
    fn orders_writes(&self) -> bool {
        self.ordered
    }
}

struct Early {
    setup: fixture::Setup,
    inner: Arc<MemoryDispatchStore>,
    commit: Arc<Semaphore>,
    durable: DurableDispatcher,
}

async fn start_committing(ordered: bool, refuse: Option<DispatchStoreError>) -> Early {
    start_failing(ordered, refuse, None).await
}

async fn start_failing(
    ordered: bool,
    refuse: Option<DispatchStoreError>,
    refuse_complete: Option<DispatchStoreError>,
) -> Early {
    let setup = fixture::setup();
    let inner = memory();
    let commit = Arc::new(Semaphore::new(0));
    let store = Arc::new(Committing {
        inner: Arc::clone(&inner),
        ordered,
        commit: Arc::clone(&commit),
        refuse,
        refuse_complete,
    });
    let durable =
        DurableDispatcher::start(setup.dispatcher.clone(), store, DurableConfig::default())
            .await
            .expect("the memory store reads");
    Early {
        setup,
        inner,
        commit,
        durable,
    }
}

#[tokio::test(start_paused = true)]
async fn the_task_reaches_its_worker_while_the_record_commits_and_the_outcome_waits_for_it() {
    let gw = start_committing(true, None).await;
    let mut worker = gw.setup.worker(1).await;
    let durable = gw.durable.clone();
    let dispatching = tokio::spawn(async move {
        durable
            .dispatch(&producer("alice"), work("early"), Duration::from_secs(60))
            .await
    });
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("early"))
        .expect("the task is pending");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !dispatching.is_finished(),
        "the outcome was told before the record committed"
    );
    gw.commit.add_permits(1);
    let awaited = dispatching
        .await
        .expect("the dispatch task")
        .expect("recorded");
    assert_eq!(awaited.outcome, Some(completed("early")));
    let row = gw
        .inner
        .get(&awaited.id)
        .await
        .expect("reads")
        .expect("the dispatch is recorded");
    assert_eq!(row.state.label(), "finished", "its outcome is recorded");
}

#[tokio::test(start_paused = true)]
async fn a_store_that_does_not_order_its_writes_gets_the_record_before_the_task_leaves() {
    let gw = start_committing(false, None).await;
    let mut worker = gw.setup.worker(1).await;
    let durable = gw.durable.clone();
    let dispatching = tokio::spawn(async move {
        durable
            .dispatch(&producer("alice"), work("late"), Duration::from_secs(60))
            .await
    });
    assert!(
        tokio::time::timeout(Duration::from_secs(5), worker.task())
            .await
            .is_err(),
        "the task left before the record returned"
    );
    gw.commit.add_permits(1);
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("late"))
        .expect("the task is pending");
    let awaited = dispatching
        .await
        .expect("the dispatch task")
        .expect("recorded");
    assert_eq!(awaited.outcome, Some(completed("late")));
}

#[tokio::test(start_paused = true)]
async fn a_refused_record_is_the_callers_answer_and_the_worker_is_told_to_stop() {
    let full = DispatchStoreError::QueueFull {
        namespace: NS.into(),
        limit: 0,
    };
    let gw = start_committing(true, Some(full.clone())).await;
    let mut worker = gw.setup.worker(1).await;
    let durable = gw.durable.clone();
    let dispatching = tokio::spawn(async move {
        durable
            .dispatch(&producer("alice"), work("refused"), Duration::from_secs(60))
            .await
    });
    let task = worker.task().await;
    let refused_at = tokio::time::Instant::now();
    gw.commit.add_permits(1);
    let answer = dispatching.await.expect("the dispatch task");
    assert_eq!(answer, Err(SubmitError::Store(full)));
    assert!(
        refused_at.elapsed() < Duration::from_secs(1),
        "the refusal was told {:?} after it came, not at once",
        refused_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        worker.sent().iter().any(|message| matches!(message,
            WorkerMessage::Cancel { task_id, reason: CancelReason::Requested }
                if *task_id == task.task_id)),
        "the worker is asked to stop"
    );
    let rows = gw
        .inner
        .list(&DispatchFilter::default())
        .await
        .expect("reads");
    assert!(rows.is_empty(), "a refused dispatch left a row: {rows:?}");
    // The worker's late answer records nothing either.
    let _ = gw
        .setup
        .dispatcher
        .complete(worker.id, task.task_id, success("refused"));
    assert!(
        gw.inner
            .list(&DispatchFilter::default())
            .await
            .expect("reads")
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn a_record_refused_by_a_failing_store_is_told_at_once_though_the_outcome_cannot_be_written()
{
    // The store fails every write: the record is refused (either while the task runs or after
    // the worker answered), and the outcome's write would be retried until shutdown. The
    // caller hears the refusal as soon as it comes, not when its wait of a minute ends.
    let down = DispatchStoreError::Unavailable {
        detail: "disk gone".into(),
    };
    for worker_answers_first in [false, true] {
        let gw = start_failing(true, Some(down.clone()), Some(down.clone())).await;
        let mut worker = gw.setup.worker(1).await;
        let durable = gw.durable.clone();
        let dispatching = tokio::spawn(async move {
            durable
                .dispatch(&producer("alice"), work("doomed"), Duration::from_secs(60))
                .await
        });
        let task = worker.task().await;
        if worker_answers_first {
            gw.setup
                .dispatcher
                .complete(worker.id, task.task_id, success("doomed"))
                .expect("the task is pending");
            // The outcome reaches the driver, which sends it behind the pending record.
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(
                !dispatching.is_finished(),
                "control: the record is still pending"
            );
        }
        let refused_at = tokio::time::Instant::now();
        gw.commit.add_permits(1);
        // Bounded: a driver that waits for the outcome's write before telling the record's
        // answer would leave the caller waiting until shutdown.
        let answer = tokio::time::timeout(Duration::from_secs(120), dispatching)
            .await
            .unwrap_or_else(|_| {
                panic!("worker answered first: {worker_answers_first}: no answer in 120 s")
            })
            .expect("the dispatch task");
        assert_eq!(
            answer,
            Err(SubmitError::Store(down.clone())),
            "worker answered first: {worker_answers_first}"
        );
        assert!(
            refused_at.elapsed() < Duration::from_secs(1),
            "worker answered first: {worker_answers_first}: the refusal was told {:?} after it \
             came",
            refused_at.elapsed()
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_submit_with_or_without_a_key_runs_nothing_before_its_record_commits() {
    // `Submit` answers with an id only once recorded, and a refusal means nothing ran: so
    // nothing is delivered before the record commits, key or no key.
    for key in [None, Some("k-1".to_string())] {
        let gw = start_committing(true, None).await;
        let mut worker = gw.setup.worker(1).await;
        let durable = gw.durable.clone();
        let submitting = tokio::spawn({
            let key = key.clone();
            async move {
                durable
                    .submit(&producer("alice"), work("submitted"), key)
                    .await
            }
        });
        assert!(
            tokio::time::timeout(Duration::from_secs(5), worker.task())
                .await
                .is_err(),
            "a submission (key {key:?}) ran before its record committed"
        );
        gw.commit.add_permits(1);
        submitting
            .await
            .expect("the submit task")
            .expect("recorded");
        let task = worker.task().await;
        assert_eq!(task.input, bytes::Bytes::from_static(b"submitted"));
    }

    // Control: on the same store a keyless durable `Dispatch` is delivered while its record
    // commits, so the wait above would have seen a task.
    let gw = start_committing(true, None).await;
    let mut worker = gw.setup.worker(1).await;
    let durable = gw.durable.clone();
    let _dispatching = tokio::spawn(async move {
        durable
            .dispatch(&producer("alice"), work("early"), Duration::from_secs(60))
            .await
    });
    tokio::time::timeout(Duration::from_secs(5), worker.task())
        .await
        .expect("a durable Dispatch is delivered while its record commits");
}
