//! Concurrent writes share transactions: one commit (one fsync) per batch, not per write.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{DispatchStore, Recorded};
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
