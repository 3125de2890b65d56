//! `/v1/events` across a gateway restart, the way a browser's `EventSource` resumes: the real
//! `switchyard serve` on loopback, a worker in this process that reconnects by itself, and a
//! page that reconnects with the `Last-Event-ID` it had before the restart.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "cluster_support/event_stream.rs"]
mod event_stream;
#[path = "durable_support/harness.rs"]
mod harness;
#[path = "cluster_support/nodes.rs"]
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use event_stream::EventStream;
use harness::{Ledger, Site, TestWorker};
use serde_json::Value;

fn connected(json: &Value) -> bool {
    json["kind"] == "connected"
}

/// The event numbers of one run start past every number of the run before, so a page
/// resuming with an id from before the restart is sent the new run's events. Before numbers
/// followed the clock, each run numbered from 1: the worker's connection after the restart
/// was number 1 again, at or below the page's id, and never sent (the wait below times out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_resuming_with_an_id_from_before_a_restart_is_sent_the_new_runs_events() {
    let site = Site::new();
    let (mut gateway, ops) = nodes::serve_with_ops(&site).await;
    let mut page = EventStream::open(ops, None).await;
    let mut worker =
        TestWorker::connect(&site, "events-echo", 1, Arc::new(Ledger::default()), |_| {
            Duration::ZERO
        })
        .await;
    let (before, id_before) = page.until(connected).await;
    let seen: u64 = id_before.parse().expect("a single node's id is a number");
    assert_eq!(
        before["seq"].as_u64(),
        Some(seen),
        "the id is the line's seq"
    );

    gateway.terminate().await;
    worker.lost().await;
    let (_gateway, ops) = nodes::serve_with_ops(&site).await;
    let mut resumed = EventStream::open(ops, Some(&id_before)).await;
    let (after, id_after) = resumed.until(connected).await;
    let next: u64 = id_after.parse().expect("a number");
    assert!(
        next > seen,
        "the new run numbers past the old: {next} after {seen}"
    );
    assert_eq!(after["seq"].as_u64(), Some(next));
    worker.stop().await;
}
