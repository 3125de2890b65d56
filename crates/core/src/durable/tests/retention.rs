//! Finished dispatches are deleted after their retention, unfinished ones never are; the
//! backlog census counts the unfinished ones.

use std::time::Duration;

use crate::durable::{DispatchStore, DurableConfig};

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn the_retention_loop_deletes_finished_dispatches_only() {
    let config = DurableConfig {
        outcome_retention: Duration::ZERO,
        purge_interval: Duration::from_secs(60),
        ..DurableConfig::default()
    };
    let gw = start_with(memory(), config).await;
    let alice = producer("alice");
    let mut worker = gw.setup.worker(1).await;
    let finished = gw.submit(&alice, "finished").await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("finished"))
        .expect("pending");
    let _ = gw
        .durable
        .await_outcome(&alice, &finished, Duration::from_secs(10))
        .await;
    let running = gw.submit(&alice, "running").await;
    let _held = worker.task().await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(gw.store.get(&finished).await, Ok(None), "purged");
    // Control: the unfinished one stays.
    assert!(gw.store.get(&running).await.expect("reads").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_finished_dispatch_within_its_retention_is_kept() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let mut worker = gw.setup.worker(1).await;
    let finished = gw.submit(&alice, "finished").await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("finished"))
        .expect("pending");
    let _ = gw
        .durable
        .await_outcome(&alice, &finished, Duration::from_secs(10))
        .await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(gw.store.get(&finished).await.expect("reads").is_some());
}

#[tokio::test(start_paused = true)]
async fn the_census_counts_the_backlog_waiting_then_running() {
    let gw = start(memory()).await;
    let alice = producer("alice");
    let id = gw.submit(&alice, "backlog").await;
    gw.until_row(&id, "parked").await;
    let census = gw.durable.census().await.expect("reads");
    assert_eq!(census.len(), 1);
    assert_eq!((census[0].waiting, census[0].running), (1, 0));
    assert_eq!(census[0].namespace, NS);
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    gw.until_row(&id, "running").await;
    let census = gw.durable.census().await.expect("reads");
    assert_eq!((census[0].waiting, census[0].running), (0, 1));
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("done"))
        .expect("pending");
    let _ = gw
        .durable
        .await_outcome(&alice, &id, Duration::from_secs(10))
        .await;
    // Control: a finished dispatch is no backlog.
    assert!(gw.durable.census().await.expect("reads").is_empty());
}

/// `docs/durability.md` and `docs/cluster.md`: outcomes are kept 24 h, the retention loop runs
/// once a minute, and a watcher's channel holds 1024 outcomes.
#[test]
fn the_durable_defaults_are_the_documented_ones() {
    let defaults = DurableConfig::default();
    assert_eq!(defaults.outcome_retention, Duration::from_secs(24 * 3600));
    assert_eq!(defaults.purge_interval, Duration::from_secs(60));
    assert_eq!(defaults.watch_capacity, 1024);
}
