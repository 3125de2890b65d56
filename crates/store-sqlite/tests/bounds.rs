//! `record` refuses what would pass a bound, and a repeated idempotency key records nothing.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::SystemTime;

use switchyard_core::{DispatchStore, DispatchStoreError, Recorded};
use switchyard_store_sqlite::SqliteOptions;

#[tokio::test]
async fn a_repeated_idempotency_key_returns_the_first_id_and_records_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let first = fixtures::keyed("ns", "order-17");
    assert_eq!(
        store.record(first.clone()).await,
        Ok(Recorded::New(first.id.clone()))
    );
    let repeat = fixtures::keyed("ns", "order-17");
    assert_eq!(
        store.record(repeat.clone()).await,
        Ok(Recorded::Existing(first.id.clone()))
    );
    assert_eq!(
        store.get(&repeat.id).await.expect("get"),
        None,
        "recorded anyway"
    );
    assert_eq!(store.unfinished().await.expect("unfinished").len(), 1);

    // Control: keys are per namespace.
    let elsewhere = fixtures::keyed("other", "order-17");
    assert_eq!(
        store.record(elsewhere.clone()).await,
        Ok(Recorded::New(elsewhere.id))
    );
}

#[tokio::test]
async fn one_key_twice_in_one_batch_still_records_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let (a, b) = (fixtures::keyed("ns", "k"), fixtures::keyed("ns", "k"));
    let (ra, rb) = tokio::join!(store.record(a.clone()), store.record(b.clone()));
    let (ra, rb) = (ra.expect("record a"), rb.expect("record b"));
    assert_eq!(ra.id(), rb.id(), "{ra:?} {rb:?}");
    assert!(
        matches!(
            (&ra, &rb),
            (Recorded::New(_), Recorded::Existing(_)) | (Recorded::Existing(_), Recorded::New(_))
        ),
        "{ra:?} {rb:?}"
    );
    assert_eq!(store.unfinished().await.expect("unfinished").len(), 1);
}

#[tokio::test]
async fn an_empty_or_overlong_key_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let empty = store.record(fixtures::keyed("ns", "")).await;
    assert_eq!(
        empty.map_err(|e| e.to_string()),
        Err("idempotency_key: empty".to_owned())
    );
    let long = store.record(fixtures::keyed("ns", &"k".repeat(300))).await;
    assert!(
        matches!(long, Err(DispatchStoreError::InvalidKey { .. })),
        "{long:?}"
    );
    assert!(store.unfinished().await.expect("unfinished").is_empty());
}

#[tokio::test]
async fn the_queue_bound_refuses_the_next_and_a_completion_makes_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SqliteOptions {
        max_queued_per_namespace: 2,
        ..SqliteOptions::default()
    };
    let store = fixtures::open_with(dir.path(), options);
    let first = fixtures::dispatch("ns", "1");
    store.record(first.clone()).await.expect("first");
    store
        .record(fixtures::dispatch("ns", "2"))
        .await
        .expect("second");
    let refused = store.record(fixtures::dispatch("ns", "3")).await;
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("`store.max_queued_per_namespace` (2) reached for namespace \"ns\"".to_owned())
    );
    let repeat_key = fixtures::keyed("ns", "k");
    assert!(
        store.record(repeat_key).await.is_err(),
        "a new key is a new dispatch, bounded too"
    );

    store
        .complete(&first.id, &fixtures::completed(""), SystemTime::now())
        .await
        .expect("complete");
    let third = fixtures::dispatch("ns", "3");
    assert_eq!(
        store.record(third.clone()).await,
        Ok(Recorded::New(third.id)),
        "a finished dispatch no longer counts"
    );
}

#[tokio::test]
async fn the_byte_bound_refuses_what_would_pass_it_and_a_purge_frees_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limit = 128 * 1024;
    let options = SqliteOptions {
        max_bytes: limit,
        ..SqliteOptions::default()
    };
    let store = fixtures::open_with(dir.path(), options);
    let input = "x".repeat(2048);
    let mut accepted = Vec::new();
    let refusal = loop {
        assert!(
            accepted.len() < 200,
            "{} records never reached the bound",
            accepted.len()
        );
        let d = fixtures::dispatch("ns", &input);
        match store.record(d.clone()).await {
            Ok(_) => accepted.push(d),
            Err(err) => break err,
        }
    };
    let DispatchStoreError::StoreFull { size, limit: named } = refusal else {
        panic!("refused with {refusal:?}");
    };
    assert_eq!(named, limit);
    assert!(size <= limit && size + 2048 > limit, "size {size}");
    assert!(accepted.len() > 10, "only {} accepted", accepted.len());
    assert_eq!(
        store.unfinished().await.expect("unfinished").len(),
        accepted.len(),
        "the refused one is not recorded"
    );

    let done = SystemTime::now();
    for d in &accepted {
        store
            .complete(&d.id, &fixtures::completed(""), done)
            .await
            .expect("complete");
    }
    store.purge(SystemTime::now()).await.expect("purge");
    let after = store.record(fixtures::dispatch("ns", &input)).await;
    assert!(
        matches!(after, Ok(Recorded::New(_))),
        "pages freed by the purge still counted: {after:?}"
    );
}
