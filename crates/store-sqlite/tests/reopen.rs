//! What a committed write returned for is still there after the store is closed and opened
//! again: the state of a restart.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::SystemTime;

use switchyard_core::{
    Completion, DispatchState, DispatchStore, DispatchStoreError, Recorded, WorkerId,
};
use switchyard_store_sqlite::SqliteOptions;

#[tokio::test]
async fn reopening_keeps_every_committed_dispatch_and_its_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let queued = fixtures::dispatch("ns", "queued");
    let parked = fixtures::dispatch("ns", "parked");
    let running = fixtures::dispatch("ns", "running");
    let finished = fixtures::dispatch("ns", "finished");
    for d in [&queued, &parked, &running, &finished] {
        let recorded = store.record(d.clone()).await.expect("record");
        assert_eq!(recorded, Recorded::New(d.id.clone()));
    }
    store.park(&parked.id, "no_workers").await.expect("park");
    store
        .claim(&running.id, WorkerId::from_raw(7), 3)
        .await
        .expect("claim");
    let done_at = SystemTime::now();
    let outcome = fixtures::completed("out");
    let completion = store.complete(&finished.id, &outcome, done_at).await;
    assert_eq!(completion, Ok(Completion::Recorded));
    drop(store);

    let store = fixtures::open(dir.path());
    let unfinished = store.unfinished().await.expect("unfinished");
    let states: Vec<_> = unfinished
        .iter()
        .map(|s| (s.dispatch.clone(), s.state.clone(), s.attempts))
        .collect();
    assert_eq!(
        states,
        vec![
            (queued, DispatchState::Queued { not_before: None }, 0),
            (
                parked,
                DispatchState::Parked {
                    reason: "no_workers".into()
                },
                0
            ),
            (
                running,
                DispatchState::Running {
                    worker: WorkerId::from_raw(7),
                    attempt: 3
                },
                3
            ),
        ],
        "unfinished after reopen: queued, parked and running, oldest first; not the finished one"
    );
    let kept = store
        .get(&finished.id)
        .await
        .expect("get")
        .expect("finished kept");
    assert_eq!(
        kept.state,
        DispatchState::Finished {
            outcome,
            at: done_at
        }
    );
    assert_eq!(kept.dispatch, finished);
}

#[tokio::test]
async fn the_queue_bound_counts_what_was_recorded_before_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SqliteOptions {
        max_queued_per_namespace: 2,
        ..SqliteOptions::default()
    };
    let store = fixtures::open_with(dir.path(), options.clone());
    for i in 0..2 {
        store
            .record(fixtures::dispatch("ns", &format!("{i}")))
            .await
            .expect("under the bound");
    }
    drop(store);
    let store = fixtures::open_with(dir.path(), options);
    let refused = store.record(fixtures::dispatch("ns", "third")).await;
    assert_eq!(
        refused,
        Err(DispatchStoreError::QueueFull {
            namespace: "ns".into(),
            limit: 2
        })
    );
    // Control: another namespace is not counted against it.
    let other = store.record(fixtures::dispatch("other", "x")).await;
    assert!(matches!(other, Ok(Recorded::New(_))), "{other:?}");
}

#[tokio::test]
async fn an_idempotency_key_is_remembered_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let first = fixtures::keyed("ns", "order-1");
    store.record(first.clone()).await.expect("record");
    drop(store);

    let store = fixtures::open(dir.path());
    let repeat = fixtures::keyed("ns", "order-1");
    assert_eq!(
        store.record(repeat).await,
        Ok(Recorded::Existing(first.id.clone()))
    );
    // Control: another key after the reopen is a new dispatch.
    let other = fixtures::keyed("ns", "order-2");
    assert_eq!(
        store.record(other.clone()).await,
        Ok(Recorded::New(other.id))
    );
}
