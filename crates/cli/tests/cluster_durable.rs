//! Durable dispatches in cluster mode, end to end: real `switchyard serve` nodes over one real
//! `nats-server -js` on loopback, SDK workers and a producer in this process.
//!
//! Each test starts its own NATS server (skipped with a printed reason when nats-server is
//! missing, unless `CI_REQUIRE_NATS` is set) and its own nodes.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;

use std::sync::Arc;
use std::time::Duration;

use harness::{Ledger, NAMESPACE, PATIENCE, Process, Site, TestWorker, serve_command, tagged};
use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;

const ACTIVITY: &str = "cluster-durable-echo";

/// A node's site: `[store]` lines `store`, then `[cluster]` on `nats` as `node` of `cluster`.
fn node_site(nats: &NatsServer, store: &str, cluster: &str, node: &str) -> Site {
    Site::with_store(&format!(
        "{store}\n[cluster]\nnats_url = \"{}\"\nname = \"{cluster}\"\nnode = \"{node}\"\n\
         member_ttl = \"3s\"\nrefresh_every = \"1s\"\n",
        nats.url()
    ))
}

/// A `Dispatch` of `activity` with input [`tagged`]`(tag)` through `site`, durable or not.
async fn dispatch(
    site: &Site,
    tag: u64,
    durable: bool,
    timeout: Duration,
) -> Result<pb::DispatchOutcome, tonic::Status> {
    let mut producer = site.producer().await.expect("the node listens");
    let reply = producer
        .0
        .dispatch(pb::DispatchRequest {
            namespace: NAMESPACE.into(),
            activity_type: ACTIVITY.into(),
            input: tagged(tag),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap(),
            durable: Some(durable),
            ..pb::DispatchRequest::default()
        })
        .await?;
    Ok(reply.into_inner().outcome.expect("an outcome"))
}

fn completed(outcome: &pb::DispatchOutcome) -> Option<&[u8]> {
    match &outcome.outcome {
        Some(pb::dispatch_outcome::Outcome::Completed(done)) => Some(&done.output),
        _ => None,
    }
}

fn quick(_: u64) -> Duration {
    Duration::from_millis(5)
}

/// The refusal every durable call gets from a cluster node without the jetstream store.
fn assert_refused_naming_the_setting(status: &tonic::Status) {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status
            .message()
            .contains("set store.backend = \"jetstream\""),
        "names the setting: {status:?}"
    );
    assert!(
        status.message().contains("cluster mode"),
        "says why: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_jetstream_a_cluster_node_refuses_durable_dispatches_naming_the_setting() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let a = node_site(&nats, "", "refuse", "a");
    let _a: Process = a.serve().await;
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&a, ACTIVITY, 2, Arc::clone(&ledger), quick).await;
    let mut producer = a.producer().await.expect("the node listens");
    let submitted = producer.submit(ACTIVITY, 1, None, PATIENCE).await;
    assert_refused_naming_the_setting(&submitted.expect_err("Submit is refused"));
    let durable = dispatch(&a, 2, true, PATIENCE).await;
    assert_refused_naming_the_setting(&durable.expect_err("a durable Dispatch is refused"));
    assert_eq!(ledger.total(), 0, "no refused dispatch ran");
    // Control: an ephemeral dispatch on the same node runs.
    let ephemeral = dispatch(&a, 3, false, PATIENCE).await.expect("accepted");
    assert_eq!(completed(&ephemeral), Some(&tagged(3)[..]), "{ephemeral:?}");
    // Control: the same store on a node without `[cluster]` takes the submission.
    let alone = Site::new();
    let _alone = alone.serve().await;
    let mut producer = alone.producer().await.expect("the node listens");
    producer
        .submit(ACTIVITY, 4, None, PATIENCE)
        .await
        .expect("a single node takes durable dispatches");
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_by_default_in_cluster_mode_without_jetstream_refuses_to_start() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let site = Site::with_store(&format!(
        "\n[dispatch]\ndurability = \"durable\"\n[cluster]\nnats_url = \"{}\"\nname = \"start\"\n\
         node = \"a\"\n",
        nats.url()
    ));
    let mut refused = serve_command(&site.config);
    let status = refused.exit().await;
    assert_eq!(status.code(), Some(2), "a configuration error");
    let stderr = refused.stderr();
    assert!(stderr.contains("store.backend"), "names the key: {stderr}");
    assert!(
        stderr.contains("set store.backend = \"jetstream\""),
        "names the setting: {stderr}"
    );
    // Control: the same node with ephemeral defaults starts.
    let ephemeral = node_site(&nats, "", "start", "a");
    let _node = ephemeral.serve().await;
}

const JETSTREAM: &str = "backend = \"jetstream\"\n";

fn a_third(_: u64) -> Duration {
    Duration::from_millis(300)
}

/// Submits `count` durable dispatches (tags `0..count`) through `site`; returns each tag and id.
async fn submit_on(site: &Site, count: u64) -> Vec<(u64, String)> {
    let mut producer = site.producer().await.expect("the node listens");
    let mut ids = Vec::new();
    for tag in 0..count {
        let submitted = producer
            .submit(ACTIVITY, tag, None, PATIENCE)
            .await
            .expect("the node takes durable dispatches");
        ids.push((tag, submitted.id));
    }
    ids
}

/// Polls `AwaitOutcome` for `id` on `site` until it has an outcome (bounded by [`PATIENCE`]).
async fn outcome_from(site: &Site, id: &str) -> pb::DispatchOutcome {
    let mut producer = site.producer().await.expect("the node listens");
    tokio::time::timeout(PATIENCE, async {
        loop {
            let heard = producer
                .await_outcome(id, Duration::from_secs(1))
                .await
                .expect("AwaitOutcome answers");
            match heard {
                Some(outcome) => return outcome,
                // No outcome within the wait (its owner was killed): ask again.
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{id} has an outcome within {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_dispatches_accepted_on_a_node_killed_with_sigkill_each_end_with_one_outcome() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, JETSTREAM, "durable", "a"),
        node_site(&nats, JETSTREAM, "durable", "b"),
        node_site(&nats, JETSTREAM, "durable", "c"),
    );
    let mut node_a = a.serve().await;
    let _others: Vec<Process> = vec![b.serve().await, c.serve().await];
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&ledger), a_third).await;
    let count = 24u64;
    let ids = submit_on(&a, count).await;
    // A durable dispatch accepted on a runs on c's worker (offered like an ephemeral one).
    tokio::time::timeout(PATIENCE, ledger.wait_total(3))
        .await
        .expect("c's worker runs a's durable dispatches");
    node_a.kill_9();
    // The test means something only if work was left unfinished at the kill.
    let mut on_b = b.producer().await.expect("b listens");
    let mut unfinished_at_kill = 0;
    for (_, id) in &ids {
        if on_b
            .await_outcome(id, Duration::ZERO)
            .await
            .expect("b reads a's ids")
            .is_none()
        {
            unfinished_at_kill += 1;
        }
    }
    assert!(
        unfinished_at_kill > 0,
        "every dispatch ended before the kill"
    );
    for (tag, id) in &ids {
        let outcome = outcome_from(&b, id).await;
        assert_eq!(
            completed(&outcome),
            Some(&tagged(*tag)[..]),
            "{id}: {outcome:?}"
        );
        // The one outcome: c, asked separately, reads the same.
        assert_eq!(outcome_from(&c, id).await, outcome, "{id}");
        let runs = ledger.executions(*tag);
        assert!((1..=2).contains(&runs), "tag {tag} ran {runs} times");
    }
    println!(
        "{count} durable dispatches, {unfinished_at_kill} unfinished at the kill, {} runs",
        ledger.total()
    );
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_dispatches_of_a_node_stopped_cleanly_are_taken_over_and_run_once() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        node_site(&nats, JETSTREAM, "clean", "a"),
        node_site(&nats, JETSTREAM, "clean", "b"),
    );
    let mut node_a = a.serve().await;
    let _node_b = b.serve().await;
    // No worker anywhere yet: every dispatch a takes is still unfinished when it stops.
    let ids = submit_on(&a, 8).await;
    let status = node_a.terminate().await;
    assert!(status.success(), "a stops cleanly: {status:?}");
    // `shutting_down` is not an outcome: they are unfinished, and b takes them over.
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&b, ACTIVITY, 2, Arc::clone(&ledger), quick).await;
    for (tag, id) in &ids {
        let outcome = outcome_from(&b, id).await;
        assert_eq!(
            completed(&outcome),
            Some(&tagged(*tag)[..]),
            "{id}: {outcome:?}"
        );
        assert_eq!(ledger.executions(*tag), 1, "tag {tag}");
    }
    worker.stop().await;
}

/// Three jetstream nodes `a`, `b`, `c` of `cluster`, started.
async fn three_nodes(nats: &NatsServer, cluster: &str) -> ([Site; 3], Vec<Process>) {
    let sites = ["a", "b", "c"].map(|node| node_site(nats, JETSTREAM, cluster, node));
    let mut processes = Vec::new();
    for site in &sites {
        processes.push(site.serve().await);
    }
    (sites, processes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn await_outcome_on_a_node_not_driving_the_dispatch_waits_for_its_outcome() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let ([a, b, c], _nodes) = three_nodes(&nats, "await").await;
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&ledger), a_third).await;
    let mut on_a = a.producer().await.expect("a listens");
    let mut on_b = b.producer().await.expect("b listens");
    for tag in 0..3u64 {
        let submitted = on_a
            .submit(ACTIVITY, tag, None, PATIENCE)
            .await
            .expect("a takes durable dispatches");
        // One call on b, which drives nothing: it waits for the outcome a records (the
        // control: answering at once, as before, would be pending, a `None` here).
        let heard = on_b
            .await_outcome(&submitted.id, PATIENCE)
            .await
            .expect("AwaitOutcome answers");
        let outcome = heard.unwrap_or_else(|| panic!("{}: b answered pending", submitted.id));
        assert_eq!(completed(&outcome), Some(&tagged(tag)[..]), "{outcome:?}");
    }
    worker.stop().await;
}

/// The next outcome `watch` hears: its dispatch id and output (bounded by [`PATIENCE`]).
async fn next_outcome(
    watch: &mut tonic::Streaming<pb::WatchOutcomesReply>,
) -> (String, Option<Vec<u8>>) {
    let reply = tokio::time::timeout(PATIENCE, watch.message())
        .await
        .expect("an outcome within PATIENCE")
        .expect("the watch stream is healthy")
        .expect("the watch stream stays open");
    let output = match reply.event {
        Some(pb::watch_outcomes_reply::Event::Outcome(outcome)) => {
            completed(&outcome).map(<[u8]>::to_vec)
        }
        other => panic!("not an outcome: {other:?}"),
    };
    (reply.dispatch_id, output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_outcomes_on_any_node_hears_outcomes_recorded_by_another_node() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let ([a, b, c], _nodes) = three_nodes(&nats, "watch").await;
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&ledger), quick).await;
    let mut watches = Vec::new();
    for site in [&b, &a] {
        let mut producer = site.producer().await.expect("the node listens");
        let watch = producer
            .0
            .watch_outcomes(pb::WatchOutcomesRequest::default())
            .await
            .expect("WatchOutcomes opens")
            .into_inner();
        watches.push(watch);
    }
    let mut on_a = a.producer().await.expect("a listens");
    let mut expected = std::collections::BTreeMap::new();
    for tag in 0..3u64 {
        let submitted = on_a
            .submit(ACTIVITY, tag, None, PATIENCE)
            .await
            .expect("a takes durable dispatches");
        expected.insert(submitted.id, Some(tagged(tag).to_vec()));
    }
    // b drives none of them (a does, on c's worker): b's watch hears each from the outcomes
    // bucket. Control: a's watch, which hears them from its own drivers, hears each once.
    for watch in &mut watches {
        let mut heard = std::collections::BTreeMap::new();
        for _ in 0..expected.len() {
            let (id, output) = next_outcome(watch).await;
            heard.insert(id, output);
        }
        assert_eq!(heard, expected);
    }
    worker.stop().await;
}

/// `docs/cluster.md`, failure cases: a node with the jetstream store does not start without
/// NATS; it waits up to 5 s, then exits naming the store, the cluster and the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jetstream_node_without_nats_exits_within_seconds_naming_the_url() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    // Nothing listens on this port.
    let url = format!("nats://127.0.0.1:{}", harness::free_port());
    let site = Site::with_store(&format!(
        "{JETSTREAM}\n[cluster]\nnats_url = \"{url}\"\nname = \"down\"\nnode = \"a\"\n"
    ));
    let started = tokio::time::Instant::now();
    let mut refused = serve_command(&site.config);
    let status = tokio::time::timeout(Duration::from_secs(30), refused.exit())
        .await
        .expect("the node exits by itself");
    let took = started.elapsed();
    assert!(!status.success(), "{status:?}");
    assert!(took < Duration::from_secs(5 + 5), "exited after {took:?}");
    let stderr = refused.stderr();
    assert!(
        stderr.contains("store jetstream (cluster down): jetstream dispatch store on")
            && stderr.contains(&url.replace("nats://", "")),
        "names the store, the cluster and the URL: {stderr}"
    );
    // Control: the same node with NATS up starts.
    let reachable = node_site(&nats, JETSTREAM, "down", "a");
    let _node = reachable.serve().await;
}
