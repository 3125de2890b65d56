//! Cluster mode end to end: real `switchyard serve` processes joined over one real
//! `nats-server -js` on loopback, SDK workers and a producer in this process.
//!
//! Each test starts its own NATS server (skipped with a printed reason when nats-server is
//! missing, unless `CI_REQUIRE_NATS` is set) and its own nodes, with a 3 s membership
//! TTL refreshed every second so a killed node is noticed quickly.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "durable_support/harness.rs"]
mod harness;
#[path = "cluster_support/nodes.rs"]
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use harness::{Ledger, NAMESPACE, PATIENCE, Process, Site, TestWorker, serve_command, tagged};
use nodes::{
    TwoNodes, completed, dispatch, http_get, http_until, is_ok, node_site, node_site_at,
    node_site_with, offer_pools_in_all, sample, serve_with_ops, takes_offers, two_nodes,
    unserved_reason,
};
use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;

const ACTIVITY: &str = "cluster-echo";

fn quick(_: u64) -> Duration {
    Duration::from_millis(5)
}

fn tenth(_: u64) -> Duration {
    Duration::from_millis(100)
}

fn two_seconds(_: u64) -> Duration {
    Duration::from_secs(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_on_a_reaches_a_worker_connected_only_to_c() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, "reach", "a"),
        node_site(&nats, "reach", "b"),
        node_site(&nats, "reach", "c"),
    );
    let _nodes: Vec<Process> = vec![a.serve().await, b.serve().await, c.serve().await];
    // No worker anywhere yet: the dispatch parks as "no capacity in cluster".
    let early = dispatch(&a, ACTIVITY, 0, Duration::from_millis(1500)).await;
    assert_eq!(
        unserved_reason(&early),
        Some(pb::UnservedReason::NoCapacityInCluster),
        "{early:?}"
    );
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&ledger), quick).await;
    for tag in 1..=5 {
        let outcome = dispatch(&a, ACTIVITY, tag, PATIENCE).await;
        assert_eq!(completed(&outcome), Some(&tagged(tag)[..]), "{outcome:?}");
        assert_eq!(
            ledger.executions(tag),
            1,
            "tag {tag} ran once, on C's worker"
        );
    }
    // Control: a gateway without `[cluster]` never sees C's worker.
    let alone = Site::new();
    let _alone = alone.serve().await;
    let outcome = dispatch(&alone, ACTIVITY, 99, Duration::from_millis(500)).await;
    assert_eq!(
        unserved_reason(&outcome),
        Some(pb::UnservedReason::NoWorkers),
        "{outcome:?}"
    );
    assert_eq!(ledger.executions(99), 0);
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_spreads_over_workers_on_b_and_c() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, "spread", "a"),
        node_site(&nats, "spread", "b"),
        node_site(&nats, "spread", "c"),
    );
    let _a = a.serve().await;
    let (_b, b_ops) = serve_with_ops(&b).await;
    let (_c, c_ops) = serve_with_ops(&c).await;
    // Control: no worker, no free slot, no offer subscription.
    let idle = http_get(b_ops, "/metrics").await;
    assert_eq!(
        sample(&idle, "switchyard_cluster_offer_pools"),
        0.0,
        "{idle}"
    );
    let (on_b, on_c) = (Arc::new(Ledger::default()), Arc::new(Ledger::default()));
    let worker_b = TestWorker::connect(&b, ACTIVITY, 2, Arc::clone(&on_b), tenth).await;
    let worker_c = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&on_c), tenth).await;
    // Both nodes' offer subscriptions are up.
    takes_offers(b_ops).await;
    takes_offers(c_ops).await;
    const DISPATCHES: u64 = 24;
    let a = Arc::new(a);
    let mut calls = tokio::task::JoinSet::new();
    for tag in 0..DISPATCHES {
        let a = Arc::clone(&a);
        calls.spawn(async move { (tag, dispatch(&a, ACTIVITY, tag, PATIENCE).await) });
    }
    let ended = tokio::time::timeout(PATIENCE, calls.join_all())
        .await
        .expect("every dispatch ends");
    for (tag, outcome) in &ended {
        assert_eq!(completed(outcome), Some(&tagged(*tag)[..]), "{outcome:?}");
        assert_eq!(
            on_b.executions(*tag) + on_c.executions(*tag),
            1,
            "tag {tag} ran exactly once"
        );
    }
    assert!(
        on_b.total() > 0 && on_c.total() > 0,
        "work spread: B ran {}, C ran {}",
        on_b.total(),
        on_c.total()
    );
    worker_b.stop().await;
    worker_c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_task_has_its_forwarded_tasks_dispatched_again() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, "kill", "a"),
        node_site(&nats, "kill", "b"),
        node_site(&nats, "kill", "c"),
    );
    let _a = a.serve().await;
    let (_b, b_ops) = serve_with_ops(&b).await;
    let (mut node_c, c_ops) = serve_with_ops(&c).await;
    let ledger = Arc::new(Ledger::default());
    let worker_b = TestWorker::connect(&b, ACTIVITY, 1, Arc::clone(&ledger), two_seconds).await;
    let worker_c = TestWorker::connect(&c, ACTIVITY, 1, Arc::clone(&ledger), two_seconds).await;
    takes_offers(b_ops).await;
    takes_offers(c_ops).await;
    let a = Arc::new(a);
    let mut calls = tokio::task::JoinSet::new();
    // Both tasks run, one on each node (one slot each), then C dies with its task. The second
    // is offered once the node running the first has asked to leave the offer group: drawn
    // there while that node is still leaving (NATS picks a group's member at random), it is
    // passed on to the other node instead of being turned away to wait for the first's slot.
    for tag in 0..2 {
        let a = Arc::clone(&a);
        calls.spawn(async move { (tag, dispatch(&a, ACTIVITY, tag, PATIENCE).await) });
        let started = tokio::time::timeout(PATIENCE, ledger.wait_total(tag as usize + 1)).await;
        assert!(started.is_ok(), "task {tag} started");
        offer_pools_in_all(&[b_ops, c_ops], 1.0 - tag as f64).await;
    }
    node_c.kill_9();
    let ended = tokio::time::timeout(PATIENCE, calls.join_all())
        .await
        .expect("every dispatch ends");
    for (tag, outcome) in &ended {
        assert_eq!(completed(outcome), Some(&tagged(*tag)[..]), "{outcome:?}");
    }
    // One task ran twice (on C, killed; again on B), the other once.
    let mut runs = [ledger.executions(0), ledger.executions(1)];
    runs.sort_unstable();
    assert_eq!(
        runs,
        [1, 2],
        "the killed node's task ran again, the other did not"
    );
    worker_b.stop().await;
    worker_c.stop().await;
}

/// A node whose pool is full (its last slot scan found it so) leaves the pool's offer group at
/// the first offer it must turn away, before its "busy" goes back, instead of at the end of the
/// hold: the origin's next try then reaches a node with a free slot, or hears that none is
/// listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_leaves_the_offer_group_at_the_first_offer_it_turns_away() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    // B would keep a full pool's subscription for 30 s: only the turned-away offer can end it
    // sooner.
    let (a, b) = (
        node_site(&nats, "full", "a"),
        node_site_with(&nats.url(), "full", "b", "offer_hold = \"30s\"\n"),
    );
    let _a = a.serve().await;
    let (_b, b_ops) = serve_with_ops(&b).await;
    let ledger = Arc::new(Ledger::default());
    let worker = TestWorker::connect(&b, ACTIVITY, 1, Arc::clone(&ledger), two_seconds).await;
    takes_offers(b_ops).await;
    let a = Arc::new(a);
    let first = {
        let a = Arc::clone(&a);
        tokio::spawn(async move { dispatch(&a, ACTIVITY, 0, PATIENCE).await })
    };
    let started = tokio::time::timeout(PATIENCE, ledger.wait_total(1)).await;
    assert!(started.is_ok(), "the first task started");
    // B's only slot is taken; short dispatches are turned away there until it leaves (at the
    // first one after its 50 ms slot scan has seen the pool full). Control: kept for the hold,
    // the subscription would stay 30 s
    // (`slots::tests::subscribes_at_one_free_slot_and_unsubscribes_only_after_the_hold`).
    let mut turned_away = 0;
    let mut left = None;
    for tag in 1..=20 {
        let outcome = dispatch(&a, ACTIVITY, tag, Duration::from_millis(100)).await;
        assert!(completed(&outcome).is_none(), "{outcome:?}");
        turned_away += 1;
        let metrics = http_get(b_ops, "/metrics").await;
        if sample(&metrics, "switchyard_cluster_offer_pools") == 0.0 {
            left = Some(outcome);
            break;
        }
    }
    let Some(leaving) = left else {
        panic!("B kept its offer subscription through {turned_away} turned-away offers");
    };
    // B, leaving, passes the offer on to the group, where it draws it again (itself the only
    // member) until its leave count is spent; then NATS tells A that nobody can take the
    // pool's offers: the dispatch that made B leave waited as `no capacity in cluster`.
    assert_eq!(
        unserved_reason(&leaving),
        Some(pb::UnservedReason::NoCapacityInCluster),
        "{leaving:?}"
    );
    assert_eq!(
        ledger.total(),
        1,
        "no turned-away task ran on the full node"
    );
    let first = first.await.expect("the first call ends");
    assert_eq!(completed(&first), Some(&tagged(0)[..]), "{first:?}");
    // Its slot free again, B takes offers again.
    takes_offers(b_ops).await;
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_down_keeps_local_traffic_and_cross_node_traffic_resumes() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let (a, c) = (
        node_site(&nats, "outage", "a"),
        node_site(&nats, "outage", "c"),
    );
    let _a = a.serve().await;
    let _c = c.serve().await;
    let ledger = Arc::new(Ledger::default());
    let local = TestWorker::connect(&a, "local-echo", 2, Arc::clone(&ledger), quick).await;
    let far = TestWorker::connect(&c, ACTIVITY, 2, Arc::clone(&ledger), quick).await;
    let before = dispatch(&a, ACTIVITY, 1, PATIENCE).await;
    assert_eq!(completed(&before), Some(&tagged(1)[..]), "{before:?}");
    nats.kill();
    for tag in 10..20 {
        let outcome = dispatch(&a, "local-echo", tag, Duration::from_secs(5)).await;
        assert_eq!(
            completed(&outcome),
            Some(&tagged(tag)[..]),
            "local, NATS down: {outcome:?}"
        );
    }
    // Control: cross-node traffic does need NATS.
    let cut = dispatch(&a, ACTIVITY, 2, Duration::from_millis(1500)).await;
    assert!(completed(&cut).is_none(), "{cut:?}");
    nats.restart();
    let after = dispatch(&a, ACTIVITY, 3, PATIENCE).await;
    assert_eq!(
        completed(&after),
        Some(&tagged(3)[..]),
        "cross-node after NATS restarts: {after:?}"
    );
    local.stop().await;
    far.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_node_name_twice_is_refused_naming_the_first() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let first = node_site(&nats, "twins", "twin");
    let _first = first.serve().await;
    let second = node_site(&nats, "twins", "twin");
    let mut refused = serve_command(&second.config);
    let status = refused.exit().await;
    assert!(
        !status.success(),
        "the second node with the name must not start"
    );
    let stderr = refused.stderr();
    assert!(
        stderr.contains("node name \"twin\" is held by a live node"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("grpc 127.0.0.1:{}", first.port)),
        "names the first: {stderr}"
    );
    // Control: another name joins.
    let other = node_site(&nats, "twins", "other");
    let _other = other.serve().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_degraded_while_nats_is_down_and_metrics_carry_the_node() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let site = node_site(&nats, "ops", "ops-a");
    let (_node, ops) = serve_with_ops(&site).await;
    let joined = http_until(ops, "/readyz", "cluster: joined as ops-a").await;
    assert!(is_ok(&joined), "{joined}");
    let metrics = http_get(ops, "/metrics").await;
    assert!(metrics.contains("node=\"ops-a\""), "{metrics}");
    let about = http_get(ops, "/v1/about").await;
    assert!(
        about.contains("\"cluster_node\":\"ops-a\""),
        "the console names the node: {about}"
    );
    nats.kill();
    let degraded = http_until(ops, "/readyz", "cluster: degraded (").await;
    assert!(
        is_ok(&degraded),
        "a degraded node still serves its own workers: {degraded}"
    );
    http_until(ops, "/healthz", "cluster: degraded (").await;
    nats.restart();
    http_until(ops, "/readyz", "cluster: joined as ops-a").await;
    // Control: a gateway without `[cluster]` has no cluster line and no node label.
    let alone = Site::new();
    let (_alone, alone_ops) = serve_with_ops(&alone).await;
    let ready = http_get(alone_ops, "/readyz").await;
    assert!(is_ok(&ready) && !ready.contains("cluster:"), "{ready}");
    let metrics = http_get(alone_ops, "/metrics").await;
    assert!(!metrics.contains("node=\""), "{metrics}");
    let about = http_get(alone_ops, "/v1/about").await;
    assert!(!about.contains("cluster_node"), "{about}");
}

/// A one-slot worker on a node: the task tagged `tag` says it started, then runs until it is
/// released or cancelled and says which came first; every other task echoes at once.
struct Holding {
    started: tokio::sync::mpsc::UnboundedReceiver<()>,
    ended: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    release: Arc<tokio::sync::Notify>,
    stop: tokio_util::sync::CancellationToken,
    running: tokio::task::JoinHandle<()>,
}

impl Holding {
    /// Registers the worker on `site` (only there).
    async fn on(site: &Site, tag: u64) -> Self {
        use switchyard_transport_grpc::{ActivityContext, GrpcWorker};
        let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
        let (ended_tx, ended) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let handler_release = Arc::clone(&release);
        let worker = GrpcWorker::builder(format!("https://localhost:{}", site.port))
            .namespaces([NAMESPACE])
            .max_concurrency(1)
            .tls(site.client_tls())
            .activity(
                ACTIVITY,
                move |ctx: ActivityContext, input: bytes::Bytes| {
                    let (started_tx, ended_tx) = (started_tx.clone(), ended_tx.clone());
                    let release = Arc::clone(&handler_release);
                    async move {
                        if input == tagged(tag) {
                            let released = release.notified();
                            let _ = started_tx.send(());
                            let end = tokio::select! {
                                () = released => "ran to its end",
                                () = ctx.cancelled() => "cancelled",
                            };
                            let _ = ended_tx.send(end);
                        }
                        Ok(input)
                    }
                },
            )
            .connect()
            .await
            .expect("the worker registers");
        let stop = worker.shutdown_token();
        let running = tokio::spawn(async move {
            let _ = worker.run().await;
        });
        Self {
            started,
            ended,
            release,
            stop,
            running,
        }
    }

    /// Waits for the held task to start (`what` says where).
    async fn started(&mut self, what: &str) {
        tokio::time::timeout(PATIENCE, self.started.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}"));
    }

    /// How the held task ended, waiting up to `within`.
    async fn ended(&mut self, within: Duration, what: &str) -> &'static str {
        tokio::time::timeout(within, self.ended.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .expect("the worker runs")
    }

    /// Whether the held task has ended yet.
    fn has_ended(&mut self) -> bool {
        !self.ended.is_empty()
    }

    /// Stops the worker.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.running.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_on_the_origin_stops_the_task_on_the_node_running_it() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, c) = (
        node_site(&nats, "cancel", "a"),
        node_site(&nats, "cancel", "c"),
    );
    let _a = a.serve().await;
    let _c = c.serve().await;
    // One slot on C; its task tagged 1 runs until cancelled.
    let mut held = Holding::on(&c, 1).await;
    let mut producer = a.producer().await.expect("A listens");
    let mut long_call = producer.clone();
    let long = tokio::spawn(async move {
        long_call
            .0
            .dispatch(pb::DispatchRequest {
                namespace: NAMESPACE.into(),
                activity_type: ACTIVITY.into(),
                input: tagged(1),
                timeout_ms: 60_000,
                durable: Some(false),
                activity_id: "long-1".into(),
                ..pb::DispatchRequest::default()
            })
            .await
            .expect("Dispatch answers")
            .into_inner()
            .outcome
            .expect("an outcome")
    });
    held.started("the long task started on C").await;
    // Control: nothing cancelled it yet.
    assert!(!held.has_ended());
    producer
        .0
        .cancel(pb::CancelDispatchRequest {
            namespace: NAMESPACE.into(),
            activity_id: "long-1".into(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .expect("the dispatch is in flight on A");
    let ended = long.await.unwrap();
    assert!(
        matches!(
            ended.outcome,
            Some(pb::dispatch_outcome::Outcome::Cancelled(_))
        ),
        "{ended:?}"
    );
    let end = held
        .ended(PATIENCE, "the cancel reached the worker on C")
        .await;
    assert_eq!(end, "cancelled");
    // C's only slot is free again: the next dispatch runs there.
    let next = dispatch(&a, ACTIVITY, 2, Duration::from_secs(10)).await;
    assert_eq!(completed(&next), Some(&tagged(2)[..]), "{next:?}");
    held.stop().await;
}

/// `docs/cluster.md`, failure table: a taker's outcome lost (NATS down between taker and
/// origin) ends the origin's dispatch `timed_out` 2 s after its deadline. The task finishes on
/// the taker after NATS is gone, well within the deadline, so only the lost outcome and the
/// grace explain the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_lost_between_nodes_ends_the_dispatch_timed_out_two_seconds_past_its_deadline() {
    use futures::StreamExt;
    const DEADLINE: Duration = Duration::from_secs(3);
    const GRACE: Duration = Duration::from_secs(2);
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let (a, c) = (node_site(&nats, "lost", "a"), node_site(&nats, "lost", "c"));
    let _a = a.serve().await;
    let (_c, c_ops) = serve_with_ops(&c).await;
    // One slot on C; the task tagged 2 starts, then waits to be released.
    let mut held = Holding::on(&c, 2).await;
    takes_offers(c_ops).await;
    // Control: with NATS up, C's outcome reaches A.
    let before = dispatch(&a, ACTIVITY, 1, PATIENCE).await;
    assert_eq!(completed(&before), Some(&tagged(1)[..]), "{before:?}");

    // NATS is cut only once A has been told "taken": C's answer to A's offer, seen on its way
    // (the offer's reply subject, then a message on it). Cut earlier, A would end the dispatch
    // as an offer nobody answered instead.
    let client = async_nats::connect(nats.url()).await.expect("NATS answers");
    let offer_subject = format!(
        "switchyard.lost.offer.{}",
        switchyard_cluster::pool_hash(NAMESPACE, "default", ACTIVITY, None)
    );
    let mut offers = client.subscribe(offer_subject).await.unwrap();
    let mut replies = client.subscribe("_INBOX.>").await.unwrap();
    client.flush().await.unwrap();

    let a = Arc::new(a);
    let origin = Arc::clone(&a);
    let asked = tokio::time::Instant::now();
    let call = tokio::spawn(async move { dispatch(&origin, ACTIVITY, 2, DEADLINE).await });
    let offer = tokio::time::timeout(PATIENCE, offers.next())
        .await
        .expect("A offers the dispatch")
        .unwrap();
    let reply = offer.reply.expect("an offer asks for an answer");
    tokio::time::timeout(PATIENCE, async {
        while let Some(message) = replies.next().await {
            if message.subject == reply {
                return;
            }
        }
    })
    .await
    .expect("C answers the offer");
    held.started("the task started on C").await;
    nats.kill();
    held.release.notify_one();
    let end = held
        .ended(
            PATIENCE,
            "the task returned on C, its outcome with nowhere to go",
        )
        .await;
    assert_eq!(end, "ran to its end");
    let ended = tokio::time::timeout(DEADLINE + GRACE + PATIENCE, call)
        .await
        .expect("the origin ends the dispatch by itself")
        .unwrap();
    let waited = asked.elapsed();
    assert!(
        matches!(
            ended.outcome,
            Some(pb::dispatch_outcome::Outcome::TimedOut(_))
        ),
        "{ended:?}"
    );
    // Not at the deadline (the taker's own end may be on its way), and not much later.
    assert!(
        waited >= DEADLINE + GRACE,
        "ended after {waited:?}, before the deadline's grace"
    );
    assert!(
        waited < DEADLINE + GRACE + Duration::from_secs(3),
        "ended after {waited:?}"
    );
    held.stop().await;
}

/// The silent nodes a node's `/v1/workers` names, read from its operations listener.
async fn silent_nodes(ops: u16) -> Vec<String> {
    let response = http_get(ops, "/v1/workers").await;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let reply: serde_json::Value = serde_json::from_str(body).expect("a JSON answer");
    reply["silent_nodes"]
        .as_array()
        .expect("silent_nodes")
        .iter()
        .map(|silent| silent["node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// `docs/cluster.md`, failure table: when the origin dies, its producer's call ends with its
/// connection, and the taker runs the task to its end (not cancelled, even once the origin
/// has aged out of its view) and drops the outcome: its slot is free again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_origin_dies_runs_to_its_end_on_the_taker() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let TwoNodes {
        a,
        c,
        a_node: mut node_a,
        c_node: _c,
        c_ops,
    } = two_nodes(&nats, "orphan").await;
    // One slot on C; the task tagged 1 starts, then waits to be released or cancelled.
    let mut held = Holding::on(&c, 1).await;
    takes_offers(c_ops).await;

    let mut producer = a.producer().await.expect("A listens");
    let call = tokio::spawn(async move {
        producer
            .0
            .dispatch(pb::DispatchRequest {
                namespace: NAMESPACE.into(),
                activity_type: ACTIVITY.into(),
                input: tagged(1),
                timeout_ms: 60_000,
                durable: Some(false),
                ..pb::DispatchRequest::default()
            })
            .await
    });
    held.started("the task started on C").await;
    // C must know A as a member before A dies, to see it go silent and then age out: A's
    // worker listed on C says so.
    let _on_a = TestWorker::connect(&a, "idle-on-a", 1, Arc::new(Ledger::default()), quick).await;
    http_until(c_ops, "/v1/workers", "\"gateway_node\":\"a\"").await;
    node_a.kill_9();
    let answer = tokio::time::timeout(PATIENCE, call)
        .await
        .expect("the producer's call ends with its connection")
        .unwrap();
    assert!(answer.is_err(), "an outcome from a dead origin: {answer:?}");
    // C hears A is gone (silent), then A's entry ages out of its view; the task still runs.
    tokio::time::timeout(PATIENCE, async {
        while !silent_nodes(c_ops).await.contains(&"a".to_owned()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        while !silent_nodes(c_ops).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("A is named silent, then ages out of C's membership");
    assert!(!held.has_ended(), "the task ended before it was released");
    held.release.notify_one();
    let end = held.ended(PATIENCE, "the released task ended").await;
    assert_eq!(end, "ran to its end");
    // Its outcome went nowhere, and C's only slot is free: C's own producer is served.
    let next = dispatch(&c, ACTIVITY, 2, Duration::from_secs(10)).await;
    assert_eq!(completed(&next), Some(&tagged(2)[..]), "{next:?}");
    held.stop().await;
}

/// `docs/cluster.md`, failure table: an offer whose answer is lost (here C hears the offer but
/// nothing it sends reaches NATS) is cancelled on every node when its 2 s are up, and the node
/// that took it stops the run. The origin, having heard no taker, parks the dispatch; with no
/// other node to take it, it ends `unserved` at its deadline, saying a node may have started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offer_whose_answer_is_lost_is_cancelled_on_the_node_that_took_it() {
    use switchyard_test_support::TcpRelay;
    const DEADLINE: Duration = Duration::from_secs(9);
    // The offer's 2 s, then the cancel's trip; the deadline is 3 s and more after.
    const CANCEL_WITHIN: Duration = Duration::from_secs(4);
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let relay = TcpRelay::start(nats.addr()).await.unwrap();
    let a = node_site(&nats, "unanswered", "a");
    let c = node_site_at(&format!("nats://{}", relay.addr()), "unanswered", "c");
    let _a = a.serve().await;
    let (_c, c_ops) = serve_with_ops(&c).await;
    // One slot on C; the task tagged 2 runs until cancelled.
    let mut held = Holding::on(&c, 2).await;
    takes_offers(c_ops).await;
    // Control: with C heard, its answer and outcome reach A.
    let before = dispatch(&a, ACTIVITY, 1, PATIENCE).await;
    assert_eq!(completed(&before), Some(&tagged(1)[..]), "{before:?}");

    relay.freeze_upstream();
    let a = Arc::new(a);
    let origin = Arc::clone(&a);
    let call = tokio::spawn(async move { dispatch(&origin, ACTIVITY, 2, DEADLINE).await });
    held.started("C took the offer and started the task, its answer going nowhere")
        .await;
    // Well before the deadline, which would stop the task on C by itself.
    let end = held
        .ended(
            CANCEL_WITHIN,
            "A's cancel for the unanswered offer stopped the task on C",
        )
        .await;
    assert_eq!(end, "cancelled");
    let ended = tokio::time::timeout(DEADLINE + PATIENCE, call)
        .await
        .expect("the dispatch ends")
        .unwrap();
    assert_eq!(
        unserved_reason(&ended),
        Some(pb::UnservedReason::NoCapacityInCluster),
        "{ended:?}"
    );
    // It does not claim no node took it: C did.
    let Some(pb::dispatch_outcome::Outcome::Unserved(unserved)) = &ended.outcome else {
        panic!("checked above");
    };
    assert!(
        unserved.detail.contains("a node may have started the task"),
        "{unserved:?}"
    );
    held.stop().await;
}

/// `docs/cluster.md`: "A taker answers an unreadable offer with an answer naming no forward
/// (all of them turned away)". The offer is sent as another node would, on the pool's offer
/// subject over NATS, and the answer read byte for byte in the documented format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_offer_is_answered_with_no_forward_taken() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let site = node_site(&nats, "wire", "c");
    let (_node, ops) = serve_with_ops(&site).await;
    let ledger = Arc::new(Ledger::default());
    let worker =
        TestWorker::connect(&site, ACTIVITY, 1, Arc::clone(&ledger), |_| Duration::ZERO).await;
    takes_offers(ops).await;
    let client = async_nats::connect(nats.url()).await.expect("NATS answers");
    let subject = format!(
        "switchyard.wire.offer.{}",
        switchyard_cluster::pool_hash(NAMESPACE, "default", ACTIVITY, None)
    );
    // An answers body: tag "SYA" 2, the taker's name (u16 length), then a count of 0.
    let mut no_forward = b"SYA\x02".to_vec();
    no_forward.extend_from_slice(&1u16.to_be_bytes());
    no_forward.extend_from_slice(b"c");
    no_forward.extend_from_slice(&0u16.to_be_bytes());
    for unreadable in [&b"not an offer"[..], b"SYO\x01", b"SYO\x02\x00\x00\xff\xff"] {
        let answer = tokio::time::timeout(
            PATIENCE,
            client.request(subject.clone(), bytes::Bytes::copy_from_slice(unreadable)),
        )
        .await
        .expect("answered in time")
        .expect("a node answers on the pool's offer subject");
        assert_eq!(answer.payload.as_ref(), no_forward, "{unreadable:?}");
    }
    // Control: the node is unharmed and still serves the pool.
    let outcome = dispatch(&site, ACTIVITY, 7, Duration::from_secs(10)).await;
    assert_eq!(completed(&outcome), Some(&tagged(7)[..]), "{outcome:?}");
    assert_eq!(ledger.executions(7), 1);
    worker.stop().await;
}

/// `docs/cluster.md`, "Subjects and buckets": a task that ends within the taker's 5 ms linger
/// has its end in the offer's answer, and no message on the origin's outcome subject; one that
/// outlives it is answered "taken" and its end follows there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_within_the_linger_rides_in_the_answer_and_a_later_one_follows_alone() {
    use futures::StreamExt;

    const QUICK: u64 = 5;
    // The long task's tag: bytes no wire field of the quick tasks' ends would carry.
    const LONG: u64 = 0x5a5a_5a5a_5a5a_5a5a;
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let TwoNodes {
        a,
        c,
        a_node: _a,
        c_node: _c,
        c_ops,
    } = two_nodes(&nats, "linger").await;
    let client = async_nats::connect(nats.url()).await.expect("NATS answers");
    let mut outcomes = client
        .subscribe("switchyard.linger.node.a.outcome")
        .await
        .expect("the test subscribes");
    client.flush().await.expect("the subscription is in place");
    // Tags below QUICK return at once; tag LONG takes 300 ms, far past the linger.
    let ledger = Arc::new(Ledger::default());
    let service = |tag: u64| Duration::from_millis(if tag == LONG { 300 } else { 0 });
    let worker = TestWorker::connect(&c, ACTIVITY, 1, Arc::clone(&ledger), service).await;
    takes_offers(c_ops).await;
    for tag in (0..QUICK).chain([LONG]) {
        let outcome = dispatch(&a, ACTIVITY, tag, PATIENCE).await;
        assert_eq!(completed(&outcome), Some(&tagged(tag)[..]), "{outcome:?}");
    }
    // C publishes in order: the outcome messages of quick tasks that outlived the linger (a
    // loaded machine can make one do so) come before the long task's.
    let mut before_the_long_one = 0;
    loop {
        let message = tokio::time::timeout(PATIENCE, outcomes.next())
            .await
            .expect("the long task's end is published")
            .expect("the subscription is open");
        if message.payload.windows(8).any(|w| w == tagged(LONG)) {
            break;
        }
        before_the_long_one += 1;
    }
    // Control: were ends never carried in the answers, every quick task would have sent one.
    assert!(
        before_the_long_one < QUICK,
        "all {QUICK} quick tasks sent their end apart from their answer"
    );
    worker.stop().await;
}

/// `docs/cluster.md`, "Forwarding": the remote dispatch keeps the origin's deadline. A worker
/// only on C sees the deadline A's producer asked for; held past it, the task is cancelled on
/// C and A's producer hears `timed_out` at that deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_task_keeps_the_origin_s_deadline() {
    use std::time::SystemTime;

    use switchyard_transport_grpc::{ActivityContext, GrpcWorker};
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let TwoNodes {
        a,
        c,
        a_node: _a,
        c_node: _c,
        c_ops,
    } = two_nodes(&nats, "deadline").await;
    // C's one-slot worker reports each task's deadline; the task tagged 2 then waits to be
    // cancelled and says when it was.
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let (cancelled_tx, mut cancelled) = tokio::sync::mpsc::unbounded_channel();
    let worker = GrpcWorker::builder(format!("https://localhost:{}", c.port))
        .namespaces([NAMESPACE])
        .max_concurrency(1)
        .tls(c.client_tls())
        .activity(
            ACTIVITY,
            move |ctx: ActivityContext, input: bytes::Bytes| {
                let (seen_tx, cancelled_tx) = (seen_tx.clone(), cancelled_tx.clone());
                async move {
                    let _ = seen_tx.send(ctx.deadline());
                    if input == tagged(2) {
                        ctx.cancelled().await;
                        let _ = cancelled_tx.send(SystemTime::now());
                    }
                    Ok(input)
                }
            },
        )
        .connect()
        .await
        .expect("the worker registers");
    let stop = worker.shutdown_token();
    let running = tokio::spawn(async move {
        let _ = worker.run().await;
    });
    takes_offers(c_ops).await;
    let deadline_seen = |asked: SystemTime, timeout: Duration, seen: SystemTime| {
        // The origin computes the time left when it forwards: a little under `timeout` from
        // `asked`, never more (the clocks are one clock here).
        let latest = asked + timeout + Duration::from_millis(50);
        let earliest = asked + timeout - Duration::from_secs(1);
        assert!(
            seen <= latest && seen >= earliest,
            "deadline {:?} after the ask, {timeout:?} asked",
            seen.duration_since(asked)
        );
    };
    // Control: a 30 s dispatch is seen with a 30 s deadline, and completes.
    let asked = SystemTime::now();
    let long = dispatch(&a, ACTIVITY, 1, Duration::from_secs(30)).await;
    assert_eq!(completed(&long), Some(&tagged(1)[..]), "{long:?}");
    let seen_long = seen.recv().await.expect("the worker saw the task");
    deadline_seen(asked, Duration::from_secs(30), seen_long);
    // A 2 s dispatch, held on C: seen with a 2 s deadline, cancelled there at it, and
    // `timed_out` at A.
    let asked = SystemTime::now();
    let held = dispatch(&a, ACTIVITY, 2, Duration::from_secs(2)).await;
    let heard = SystemTime::now();
    assert!(
        matches!(
            held.outcome,
            Some(pb::dispatch_outcome::Outcome::TimedOut(_))
        ),
        "{held:?}"
    );
    let seen_held = seen.recv().await.expect("the worker saw the task");
    deadline_seen(asked, Duration::from_secs(2), seen_held);
    let cancelled_at = tokio::time::timeout(PATIENCE, cancelled.recv())
        .await
        .expect("the task on C was cancelled")
        .expect("the worker runs");
    let after = |at: SystemTime| at.duration_since(asked).unwrap_or_default();
    assert!(
        after(cancelled_at) < Duration::from_secs(5),
        "cancelled {:?} after the ask",
        after(cancelled_at)
    );
    assert!(
        after(heard) >= Duration::from_millis(1900) && after(heard) < Duration::from_secs(5),
        "timed out {:?} after the ask",
        after(heard)
    );
    stop.cancel();
    let _ = running.await;
}

/// `docs/cluster.md`, "Cluster-wide views": a drain asked on A of a worker on C runs on C with
/// its deadline: the task still running at the deadline is cancelled there, and the progress
/// A reports counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_asked_on_a_keeps_its_deadline_on_the_node_running_the_worker() {
    const DEADLINE: Duration = Duration::from_millis(800);
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let TwoNodes {
        a,
        c,
        a_node: _a,
        c_node: _c,
        c_ops,
    } = two_nodes(&nats, "drained").await;
    let mut held = Holding::on(&c, 1).await;
    takes_offers(c_ops).await;
    let a = Arc::new(a);
    let origin = Arc::clone(&a);
    let call = tokio::spawn(async move { dispatch(&origin, ACTIVITY, 1, PATIENCE).await });
    held.started("the task started on C").await;
    let mut producer = a.producer().await.expect("A listens");
    let listed = producer
        .0
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("ListWorkers answers")
        .into_inner();
    let worker = listed
        .workers
        .iter()
        .find(|w| w.gateway_node == "c")
        .unwrap_or_else(|| panic!("C's worker listed on A: {listed:?}"))
        .worker_id;
    let asked = tokio::time::Instant::now();
    let mut progress = producer
        .0
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::WorkerId(worker)),
            deadline_ms: DEADLINE.as_millis() as u64,
        })
        .await
        .expect("Drain answers")
        .into_inner();
    let last = tokio::time::timeout(PATIENCE, async {
        loop {
            let step = progress
                .message()
                .await
                .expect("progress")
                .expect("progress until done");
            if step.done {
                return step;
            }
        }
    })
    .await
    .expect("the drain finishes");
    let end = held.ended(PATIENCE, "the task on C ended").await;
    let took = asked.elapsed();
    assert_eq!(end, "cancelled", "the deadline cancelled the running task");
    assert!(
        took >= DEADLINE,
        "the drain ended after {took:?}, before its deadline"
    );
    assert!(took < DEADLINE + Duration::from_secs(5), "{took:?}");
    assert_eq!(last.cancelled_at_deadline, 1, "{last:?}");
    assert_eq!(last.workers_left, 1, "{last:?}");
    call.abort();
    held.stop().await;
}
