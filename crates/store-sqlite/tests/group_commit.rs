//! Concurrent writes share transactions: one commit (one fsync) per batch, not per write.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use switchyard_core::{
    Completion, DispatchState, DispatchStore, Recorded, StoredDispatch, WorkerId,
};
use switchyard_store_sqlite::{SqliteOptions, SqliteStore};

const WRITES: usize = 200;

/// Records `WRITES` dispatches from as many concurrent tasks; returns the store's commits.
async fn record_concurrently(store: SqliteStore) -> u64 {
    let store = Arc::new(store);
    let tasks: Vec<_> = (0..WRITES)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                store
                    .record(fixtures::dispatch("ns", &format!("{i}")))
                    .await
            })
        })
        .collect();
    for task in tasks {
        let recorded = task.await.expect("record task");
        assert!(matches!(recorded, Ok(Recorded::New(_))), "{recorded:?}");
    }
    assert_eq!(store.unfinished().await.expect("unfinished").len(), WRITES);
    store.commits()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_records_share_transactions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grouped = record_concurrently(fixtures::open(dir.path())).await;
    assert!(
        grouped < WRITES as u64,
        "{grouped} transactions for {WRITES} records: no group commit"
    );
    assert!(grouped > 0);

    // Control: with batches of one the counter sees one transaction per record, so the bound
    // above is the batching and not a counter that misses commits.
    let dir = tempfile::tempdir().expect("tempdir");
    let single = SqliteOptions {
        max_batch: 1,
        max_delay: Duration::ZERO,
        ..SqliteOptions::default()
    };
    let one_by_one = record_concurrently(fixtures::open_with(dir.path(), single)).await;
    assert_eq!(one_by_one, WRITES as u64);
}

/// A store whose writer holds a record sent before its outcome for an hour: only the outcome,
/// a read or the store's close lets it be written.
fn holding(dir: &std::path::Path) -> SqliteStore {
    fixtures::open_with(
        dir,
        SqliteOptions {
            hold_for_outcome: Duration::from_secs(3600),
            ..SqliteOptions::default()
        },
    )
}

fn finished_attempts(row: &StoredDispatch) -> Option<u32> {
    match row.state {
        DispatchState::Finished { .. } => Some(row.attempts),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_before_its_outcome_waits_for_it_and_both_commit_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = holding(dir.path());
    let dispatch = fixtures::dispatch("ns", "in");
    let id = dispatch.id.clone();
    let before = store.commits();
    let (recorded, completion) =
        tokio::join!(store.record_before_outcome(Arc::new(dispatch)), async {
            store
                .claim(&id, WorkerId::from_raw(1), 1)
                .await
                .expect("claim");
            store
                .complete(&id, &fixtures::completed("out"), SystemTime::now())
                .await
        });
    assert_eq!(recorded, Ok(Recorded::New(id.clone())));
    assert_eq!(completion, Ok(Completion::Recorded));
    assert_eq!(
        store.commits() - before,
        1,
        "the record, its claim and its outcome in one transaction"
    );
    let row = store.get(&id).await.expect("get").expect("recorded");
    assert_eq!(
        finished_attempts(&row),
        Some(1),
        "finished, the claim's attempt kept"
    );

    // Control: without a hold the record commits on its own, before any outcome is sent.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open_with(
        dir.path(),
        SqliteOptions {
            hold_for_outcome: Duration::ZERO,
            ..SqliteOptions::default()
        },
    );
    let dispatch = fixtures::dispatch("ns", "in");
    let id = dispatch.id.clone();
    let before = store.commits();
    let recorded = store.record_before_outcome(Arc::new(dispatch)).await;
    assert_eq!(recorded, Ok(Recorded::New(id.clone())));
    let completion = store
        .complete(&id, &fixtures::completed("out"), SystemTime::now())
        .await;
    assert_eq!(completion, Ok(Completion::Recorded));
    assert_eq!(store.commits() - before, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_record_is_written_for_a_read_behind_it_and_when_the_store_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(holding(dir.path()));
    let dispatch = fixtures::dispatch("ns", "in");
    let id = dispatch.id.clone();
    let recording = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.record_before_outcome(Arc::new(dispatch)).await })
    };
    // A read waits for every write sent before it: the held record among them. Until the
    // record is sent the read may find nothing, so it is asked again.
    let row = loop {
        if let Some(row) = store.get(&id).await.expect("get") {
            break row;
        }
        tokio::task::yield_now().await;
    };
    assert!(
        matches!(row.state, DispatchState::Queued { .. }),
        "{:?}",
        row.state
    );
    assert_eq!(
        recording.await.expect("record task"),
        Ok(Recorded::New(id.clone())),
        "the read's commit answered the record"
    );

    // A record held when the store closes is written before the writer stops.
    let held = fixtures::dispatch("ns", "held");
    let held_id = held.id.clone();
    let mut sending = Box::pin(store.record_before_outcome(Arc::new(held)));
    // Polled once: queued for the writer, then abandoned as a crashed caller would.
    tokio::select! {
        biased;
        answer = &mut sending => panic!("answered while held: {answer:?}"),
        () = std::future::ready(()) => {}
    }
    drop(sending);
    drop(Arc::into_inner(store).expect("the only handle"));
    let reopened = fixtures::open(dir.path());
    let unfinished = reopened.unfinished().await.expect("unfinished");
    assert!(
        unfinished.iter().any(|row| row.dispatch.id == held_id),
        "the held record was lost at close"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_for_its_outcome_and_is_written_for_a_read_that_comes_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = holding(dir.path());
    let dispatch = fixtures::dispatch("ns", "in");
    let id = dispatch.id.clone();
    assert_eq!(store.record(dispatch).await, Ok(Recorded::New(id.clone())));
    let before = store.commits();
    store
        .claim(&id, WorkerId::from_raw(1), 2)
        .await
        .expect("claim");
    let completion = store
        .complete(&id, &fixtures::completed("out"), SystemTime::now())
        .await;
    assert_eq!(completion, Ok(Completion::Recorded));
    assert_eq!(
        store.commits() - before,
        1,
        "the claim went into its outcome's transaction"
    );
    let row = store.get(&id).await.expect("get").expect("recorded");
    assert_eq!(finished_attempts(&row), Some(2), "the claim's attempt kept");

    // Control: a read before the outcome finds the claim written.
    let dispatch = fixtures::dispatch("ns", "in");
    let id = dispatch.id.clone();
    assert_eq!(store.record(dispatch).await, Ok(Recorded::New(id.clone())));
    store
        .claim(&id, WorkerId::from_raw(1), 1)
        .await
        .expect("claim");
    let row = store.get(&id).await.expect("get").expect("recorded");
    assert!(
        matches!(row.state, DispatchState::Running { attempt: 1, .. }),
        "{:?}",
        row.state
    );
}
