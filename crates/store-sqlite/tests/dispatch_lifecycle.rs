//! One dispatch through the store: record, get, park, claim, release, complete (the first
//! outcome wins), list, census and purge.
#![allow(clippy::expect_used, clippy::panic)]

#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::{Duration, SystemTime};

use switchyard_core::{
    Completion, DispatchFilter, DispatchId, DispatchState, DispatchStore, OutcomeRecord, Recorded,
    WorkerId,
};

#[tokio::test]
async fn get_returns_what_was_recorded_and_nothing_for_an_unknown_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let mut submitted = fixtures::keyed("ns", "k-1");
    submitted.node = Some("gpu-1".into());
    let recorded = store.record(submitted.clone()).await.expect("record");
    assert_eq!(recorded, Recorded::New(submitted.id.clone()));

    let stored = store
        .get(&submitted.id)
        .await
        .expect("get")
        .expect("recorded");
    assert_eq!(stored.dispatch, submitted, "every field round-trips");
    assert_eq!(stored.state, DispatchState::Queued { not_before: None });
    assert_eq!(stored.attempts, 0);
    assert_eq!(store.get(&DispatchId::generate()).await.expect("get"), None);
}

#[tokio::test]
async fn park_claim_and_release_move_the_state_and_count_attempts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let d = fixtures::dispatch("ns", "x");
    store.record(d.clone()).await.expect("record");
    let state = async || store.get(&d.id).await.expect("get").expect("recorded");

    store.park(&d.id, "all_at_capacity").await.expect("park");
    assert_eq!(
        state().await.state,
        DispatchState::Parked {
            reason: "all_at_capacity".into()
        }
    );
    store
        .claim(&d.id, WorkerId::from_raw(9), 1)
        .await
        .expect("claim");
    let running = state().await;
    assert_eq!(
        running.state,
        DispatchState::Running {
            worker: WorkerId::from_raw(9),
            attempt: 1
        }
    );
    assert_eq!(running.attempts, 1);

    let before = SystemTime::now();
    store
        .release(&d.id, Duration::from_secs(30))
        .await
        .expect("release");
    let released = state().await;
    let DispatchState::Queued {
        not_before: Some(not_before),
    } = released.state
    else {
        panic!("not queued with a delay: {released:?}");
    };
    assert!(not_before >= before + Duration::from_secs(30));
    assert_eq!(released.attempts, 1, "a release keeps the attempts made");

    store
        .claim(&d.id, WorkerId::from_raw(4), 2)
        .await
        .expect("claim");
    store
        .claim(&d.id, WorkerId::from_raw(4), 1)
        .await
        .expect("late claim");
    assert_eq!(
        state().await.attempts,
        2,
        "a late, lower attempt does not go back"
    );
    store.release(&d.id, Duration::ZERO).await.expect("release");
    assert_eq!(
        state().await.state,
        DispatchState::Queued { not_before: None }
    );
}

#[tokio::test]
async fn the_first_outcome_wins_and_later_writes_do_not_reopen_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let d = fixtures::dispatch("ns", "x");
    store.record(d.clone()).await.expect("record");
    let first = fixtures::completed("first");
    let at = SystemTime::now();
    assert_eq!(
        store.complete(&d.id, &first, at).await,
        Ok(Completion::Recorded)
    );

    let second = OutcomeRecord {
        kind: "failed".into(),
        message: "late".into(),
        retryable: true,
        ..fixtures::completed("")
    };
    assert_eq!(
        store.complete(&d.id, &second, SystemTime::now()).await,
        Ok(Completion::AlreadyFinished(first.clone()))
    );
    store.park(&d.id, "no_workers").await.expect("park");
    store
        .claim(&d.id, WorkerId::from_raw(1), 5)
        .await
        .expect("claim");
    store.release(&d.id, Duration::ZERO).await.expect("release");
    let stored = store.get(&d.id).await.expect("get").expect("recorded");
    assert_eq!(stored.state, DispatchState::Finished { outcome: first, at });
    assert!(store.unfinished().await.expect("unfinished").is_empty());

    assert_eq!(
        store
            .complete(&DispatchId::generate(), &second, SystemTime::now())
            .await,
        Ok(Completion::Unknown)
    );
}

#[tokio::test]
async fn two_completions_in_one_batch_still_have_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let d = fixtures::dispatch("ns", "x");
    store.record(d.clone()).await.expect("record");
    let (a, b) = (fixtures::completed("a"), fixtures::completed("b"));
    let now = SystemTime::now();
    let (first, second) = tokio::join!(
        store.complete(&d.id, &a, now),
        store.complete(&d.id, &b, now)
    );
    let winners = [&first, &second]
        .iter()
        .filter(|c| matches!(c, Ok(Completion::Recorded)))
        .count();
    assert_eq!(winners, 1, "{first:?} {second:?}");
    assert!(
        [&first, &second]
            .iter()
            .any(|c| matches!(c, Ok(Completion::AlreadyFinished(_)))),
        "{first:?} {second:?}"
    );
}

#[tokio::test]
async fn list_filters_by_pool_state_and_principal_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let t0 = SystemTime::now();
    let mut made = Vec::new();
    for (i, (namespace, principal)) in [("a", "p"), ("b", "p"), ("a", "q"), ("a", "p")]
        .into_iter()
        .enumerate()
    {
        let mut d = fixtures::dispatch(namespace, &format!("{i}"));
        d.principal = principal.into();
        d.submitted_at = t0 + Duration::from_secs(10 - i as u64);
        store.record(d.clone()).await.expect("record");
        made.push(d);
    }
    store
        .complete(&made[3].id, &fixtures::completed(""), SystemTime::now())
        .await
        .expect("complete");
    let ids = async |filter: DispatchFilter| -> Vec<DispatchId> {
        let rows = store.list(&filter).await.expect("list");
        rows.into_iter().map(|s| s.dispatch.id).collect()
    };
    let all = ids(DispatchFilter::default()).await;
    assert_eq!(
        all,
        [3, 2, 1, 0].map(|i| made[i].id.clone()),
        "every row, oldest submission first"
    );
    let in_a = ids(DispatchFilter {
        namespace: Some("a".into()),
        principal: Some("p".into()),
        ..DispatchFilter::default()
    })
    .await;
    assert_eq!(in_a, [3, 0].map(|i| made[i].id.clone()));
    let queued_in_a = ids(DispatchFilter {
        namespace: Some("a".into()),
        state: Some("queued".into()),
        limit: 1,
        ..DispatchFilter::default()
    })
    .await;
    assert_eq!(
        queued_in_a,
        [made[2].id.clone()],
        "limit 1, the finished one left out"
    );
}

#[tokio::test]
async fn census_counts_waiting_and_running_per_pool_with_the_oldest_age() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let now = SystemTime::now();
    let mut old = fixtures::dispatch("ns", "old");
    old.submitted_at = now - Duration::from_secs(90);
    let mut young = fixtures::dispatch("ns", "young");
    young.submitted_at = now - Duration::from_secs(5);
    let mut oldest_but_running = fixtures::dispatch("ns", "running");
    oldest_but_running.submitted_at = now - Duration::from_secs(500);
    let mut other_pool = fixtures::dispatch("ns", "other");
    other_pool.activity_type = "encode".into();
    other_pool.submitted_at = now - Duration::from_secs(2);
    let finished = fixtures::dispatch("ns", "finished");
    for d in [&old, &young, &oldest_but_running, &other_pool, &finished] {
        store.record(d.clone()).await.expect("record");
    }
    store.park(&young.id, "no_workers").await.expect("park");
    store
        .claim(&oldest_but_running.id, WorkerId::from_raw(1), 1)
        .await
        .expect("claim");
    store
        .complete(&finished.id, &fixtures::completed(""), now)
        .await
        .expect("complete");

    let census = store.census(now).await.expect("census");
    let rows: Vec<_> = census
        .iter()
        .map(|c| {
            (
                c.activity_type.as_str(),
                c.waiting,
                c.running,
                c.oldest_waiting,
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("encode", 1, 0, Some(Duration::from_secs(2))),
            ("resize", 2, 1, Some(Duration::from_secs(90))),
        ],
        "the running one is not waiting; the finished one is not counted"
    );
}

#[tokio::test]
async fn purge_deletes_only_what_finished_before_the_cutoff() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    // After the three submissions, as a retention's cutoff is.
    let cutoff = SystemTime::now() + Duration::from_secs(10);
    let (early, late, open) = (
        fixtures::keyed("ns", "early"),
        fixtures::dispatch("ns", "late"),
        fixtures::dispatch("ns", "open"),
    );
    // The due one recorded last: rows the purge keeps do not stop it.
    for d in [&open, &late, &early] {
        store.record(d.clone()).await.expect("record");
    }
    let outcome = fixtures::completed("");
    store
        .complete(&early.id, &outcome, cutoff - Duration::from_secs(1))
        .await
        .expect("complete");
    store
        .complete(&late.id, &outcome, cutoff + Duration::from_secs(1))
        .await
        .expect("complete");

    assert_eq!(store.purge(cutoff).await, Ok(1));
    assert_eq!(store.get(&early.id).await.expect("get"), None);
    assert!(
        store.get(&late.id).await.expect("get").is_some(),
        "finished after the cutoff"
    );
    assert!(
        store.get(&open.id).await.expect("get").is_some(),
        "unfinished"
    );
    assert_eq!(store.purge(cutoff).await, Ok(0), "nothing left to purge");

    let again = fixtures::keyed("ns", "early");
    assert_eq!(
        store.record(again.clone()).await,
        Ok(Recorded::New(again.id)),
        "a purged dispatch's idempotency key is free again"
    );
}

#[tokio::test]
async fn a_purge_longer_than_one_window_deletes_everything_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = std::sync::Arc::new(fixtures::open(dir.path()));
    let at = SystemTime::now();
    let tasks: Vec<_> = (0..5000)
        .map(|i| {
            let store = std::sync::Arc::clone(&store);
            tokio::spawn(async move {
                let d = fixtures::dispatch("ns", &format!("{i}"));
                store.record(d.clone()).await.expect("record");
                store
                    .complete(&d.id, &fixtures::completed(""), at)
                    .await
                    .expect("complete");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    // After every submission (the purge stops at the first dispatch submitted at or after it).
    let cutoff = SystemTime::now() + Duration::from_secs(1);
    assert_eq!(store.purge(cutoff).await, Ok(5000));
    assert!(
        store
            .list(&Default::default())
            .await
            .expect("list")
            .is_empty()
    );
}

#[tokio::test]
async fn a_purge_ends_at_the_first_dispatch_submitted_at_or_after_its_cutoff() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let cutoff = SystemTime::now();
    let outcome = fixtures::completed("");
    // Recorded in this order: one submitted before the cutoff, one at it, then one stamped
    // before it again (as after the clock was set back); all finished before it.
    let mut first = fixtures::dispatch("ns", "first");
    first.submitted_at = cutoff - Duration::from_secs(30);
    let mut at_cutoff = fixtures::dispatch("ns", "at the cutoff");
    at_cutoff.submitted_at = cutoff;
    let mut stamped_earlier = fixtures::dispatch("ns", "stamped earlier");
    stamped_earlier.submitted_at = cutoff - Duration::from_secs(20);
    for d in [&first, &at_cutoff, &stamped_earlier] {
        store.record(d.clone()).await.expect("record");
        let finished = cutoff - Duration::from_secs(10);
        store
            .complete(&d.id, &outcome, finished)
            .await
            .expect("complete");
    }

    assert_eq!(store.purge(cutoff).await, Ok(1), "only the first");
    assert_eq!(store.get(&first.id).await.expect("get"), None);
    for kept in [&at_cutoff, &stamped_earlier] {
        assert!(store.get(&kept.id).await.expect("get").is_some());
    }
    // Control: a cutoff after the second's submission reaches the third too.
    let later = cutoff + Duration::from_secs(1);
    assert_eq!(store.purge(later).await, Ok(2));
}

/// A record and its dispatch's complete issued together (one batch: the row goes in finished)
/// read back exactly as the outcome given, with every outcome column.
#[tokio::test]
async fn a_record_and_its_complete_together_read_back_finished_with_the_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fixtures::open(dir.path());
    let d = fixtures::dispatch("ns", "x");
    let outcome = OutcomeRecord {
        kind: "failed".into(),
        message: "bad input".into(),
        retryable: true,
        reason: "why".into(),
        attempts: 3,
        ..fixtures::completed("out")
    };
    let at = SystemTime::now();
    let (recorded, completed) =
        tokio::join!(store.record(d.clone()), store.complete(&d.id, &outcome, at));
    assert!(recorded.is_ok(), "{recorded:?}");
    assert_eq!(completed, Ok(Completion::Recorded));
    let stored = store.get(&d.id).await.expect("get").expect("recorded");
    assert_eq!(stored.state, DispatchState::Finished { outcome, at });
    assert!(store.unfinished().await.expect("unfinished").is_empty());
}
