//! The jetstream dispatch store against a real `nats-server -js` on loopback: the store
//! rules every dispatch store keeps (first outcome wins, idempotency per namespace, purge),
//! held across nodes, and the takeover of a lost node's dispatches.
//!
//! Each test starts its own NATS server (skipped with a printed reason when nats-server is
//! missing, unless `CI_REQUIRE_NATS` is set) and uses its own cluster name.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use switchyard_cluster::{ClusterConfig, JetStreamLimits, JetStreamStore};
use switchyard_core::{
    Completion, DispatchFilter, DispatchId, DispatchState, DispatchStore, NewDispatch,
    OutcomeRecord, Recorded, StoredDispatch, WorkerId,
};
use switchyard_test_support::NatsServer;
use tokio_util::sync::CancellationToken;

const LIMITS: JetStreamLimits = JetStreamLimits {
    max_bytes: 1 << 24,
    max_queued_per_namespace: 100_000,
};

async fn store(nats: &NatsServer, cluster: &str, node: &str) -> JetStreamStore {
    JetStreamStore::open(&ClusterConfig::new(nats.url(), cluster, node), LIMITS)
        .await
        .expect("the store opens")
}

fn dispatch(namespace: &str, input: &str, key: Option<&str>) -> NewDispatch {
    let now = SystemTime::now();
    NewDispatch {
        id: DispatchId::generate(),
        namespace: namespace.to_owned(),
        task_queue: "default".to_owned(),
        activity_type: "echo".to_owned(),
        node: None,
        input: Bytes::from(input.to_owned()),
        principal: "shop".to_owned(),
        idempotency_key: key.map(str::to_owned),
        submitted_at: now,
        deadline: now + Duration::from_secs(60),
    }
}

fn outcome(text: &str) -> OutcomeRecord {
    OutcomeRecord::from(&switchyard_core::ActivityOutcome::Completed(Bytes::from(
        text.to_owned(),
    )))
}

fn finished_with(row: &StoredDispatch) -> Option<&OutcomeRecord> {
    match &row.state {
        DispatchState::Finished { outcome, .. } => Some(outcome),
        _ => None,
    }
}

#[tokio::test]
async fn the_first_outcome_wins_whichever_node_records_it() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "first", "a").await,
        store(&nats, "first", "b").await,
    );
    let d = dispatch("payments", "order 7", None);
    let id = a.record(d.clone()).await.unwrap().id().clone();
    let at = SystemTime::now();
    assert_eq!(
        b.complete(&id, &outcome("b's"), at).await,
        Ok(Completion::Recorded)
    );
    assert_eq!(
        a.complete(&id, &outcome("a's"), at).await,
        Ok(Completion::AlreadyFinished(outcome("b's")))
    );
    for node in [&a, &b] {
        let row = node.get(&id).await.unwrap().expect("recorded");
        assert_eq!(finished_with(&row), Some(&outcome("b's")));
        assert_eq!(row.dispatch.input, d.input);
    }
    assert!(
        a.unfinished().await.unwrap().is_empty(),
        "finished is not unfinished"
    );
    // Both at once: exactly one is recorded.
    let raced = a
        .record(dispatch("payments", "race", None))
        .await
        .unwrap()
        .id()
        .clone();
    let (ox, oy) = (outcome("x"), outcome("y"));
    let (x, y) = tokio::join!(a.complete(&raced, &ox, at), b.complete(&raced, &oy, at));
    let recorded = [&x, &y]
        .iter()
        .filter(|c| matches!(c, Ok(Completion::Recorded)))
        .count();
    assert_eq!(recorded, 1, "{x:?} {y:?}");
    // Control: an id never recorded is unknown, not finished.
    assert_eq!(
        a.complete(&DispatchId::generate(), &outcome("z"), at).await,
        Ok(Completion::Unknown)
    );
}

#[tokio::test]
async fn idempotency_keys_hold_across_nodes_per_namespace_until_purged() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "keys", "a").await,
        store(&nats, "keys", "b").await,
    );
    let first = a
        .record(dispatch("payments", "1", Some("order-7")))
        .await
        .unwrap();
    assert!(matches!(first, Recorded::New(_)));
    let again = b
        .record(dispatch("payments", "2", Some("order-7")))
        .await
        .unwrap();
    assert_eq!(again, Recorded::Existing(first.id().clone()));
    // Control: the same key in another namespace is a new dispatch.
    let other = b
        .record(dispatch("billing", "3", Some("order-7")))
        .await
        .unwrap();
    assert!(matches!(other, Recorded::New(_)));
    // Purged with its outcome: the key is free again.
    a.complete(first.id(), &outcome("done"), SystemTime::now())
        .await
        .unwrap();
    let cutoff = SystemTime::now() + Duration::from_secs(1);
    assert_eq!(b.purge(cutoff).await, Ok(1), "only the finished one");
    assert_eq!(a.get(first.id()).await, Ok(None));
    let after = b
        .record(dispatch("payments", "4", Some("order-7")))
        .await
        .unwrap();
    assert!(matches!(after, Recorded::New(_)), "{after:?}");
    assert!(
        b.get(other.id()).await.unwrap().is_some(),
        "unfinished rows stay"
    );
}

#[tokio::test]
async fn each_node_resumes_only_the_dispatches_it_owns_and_notes_their_state() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "own", "a").await,
        store(&nats, "own", "b").await,
    );
    let a1 = a
        .record(dispatch("ns", "a1", None))
        .await
        .unwrap()
        .id()
        .clone();
    let a2 = a
        .record(dispatch("ns", "a2", None))
        .await
        .unwrap()
        .id()
        .clone();
    let b1 = b
        .record(dispatch("ns", "b1", None))
        .await
        .unwrap()
        .id()
        .clone();
    a.claim(&a1, WorkerId::from_raw(3), 1).await.unwrap();
    a.park(&a2, "no_workers").await.unwrap();
    // A restart of node a: a new store under the same name.
    drop(a);
    let a = store(&nats, "own", "a").await;
    let ids = |rows: Vec<StoredDispatch>| -> Vec<DispatchId> {
        rows.into_iter().map(|r| r.dispatch.id).collect()
    };
    assert_eq!(
        ids(a.unfinished().await.unwrap()),
        vec![a1.clone(), a2.clone()]
    );
    assert_eq!(ids(b.unfinished().await.unwrap()), vec![b1.clone()]);
    let row = b.get(&a1).await.unwrap().unwrap();
    assert_eq!(
        row.state,
        DispatchState::Running {
            worker: WorkerId::from_raw(3),
            attempt: 1
        }
    );
    assert_eq!(row.attempts, 1);
    let census = a.census(SystemTime::now()).await.unwrap();
    assert_eq!(
        (census[0].waiting, census[0].running),
        (1, 1),
        "a's own only"
    );
    let listed = b
        .list(&DispatchFilter {
            state: Some("parked".to_owned()),
            ..DispatchFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(ids(listed), vec![a2.clone()], "list sees every node's");
    // Control: a note from a node that does not own the dispatch changes nothing.
    b.park(&a1, "no_workers").await.unwrap();
    assert!(matches!(
        b.get(&a1).await.unwrap().unwrap().state,
        DispatchState::Running { .. }
    ));
}

/// Puts `nodes` into the cluster's membership bucket, as live nodes' entries.
async fn members(
    nats: &NatsServer,
    cluster: &str,
    nodes: &[&str],
) -> async_nats::jetstream::kv::Store {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let name = format!("switchyard_{cluster}_nodes");
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: format!("KV_{name}"),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let kv = js.get_key_value(&name).await.unwrap();
    for node in nodes {
        kv.put(*node, Bytes::from_static(b"{}")).await.unwrap();
    }
    kv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_nodes_dispatches_are_taken_over_by_exactly_one_survivor() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let cluster = "takeover";
    let kv = members(&nats, cluster, &["a", "b", "c"]).await;
    let a = store(&nats, cluster, "a").await;
    let mut recorded = Vec::new();
    for n in 0..20 {
        let id = a
            .record(dispatch("ns", &format!("{n}"), None))
            .await
            .unwrap();
        recorded.push(id.id().clone());
    }
    let (adopted_tx, mut adopted) = tokio::sync::mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let mut survivors = Vec::new();
    for node in ["b", "c"] {
        let survivor = store(&nats, cluster, node).await;
        let tx = adopted_tx.clone();
        let stop = stop.clone();
        survivors.push(tokio::spawn(async move {
            survivor
                .take_over_lost_nodes(
                    Duration::from_millis(100),
                    move |rows| {
                        for row in rows {
                            tx.send((node, row.dispatch.id)).unwrap();
                        }
                    },
                    stop,
                )
                .await;
        }));
    }
    // Control: while a's entry lives, nobody takes anything over (several scans).
    let early = tokio::time::timeout(Duration::from_millis(600), adopted.recv()).await;
    assert!(early.is_err(), "taken over while a lives: {early:?}");
    kv.delete("a").await.unwrap();
    let mut owners: HashMap<DispatchId, Vec<&str>> = HashMap::new();
    while owners.len() < recorded.len() {
        let (node, id) = tokio::time::timeout(Duration::from_secs(30), adopted.recv())
            .await
            .expect("every dispatch is taken over")
            .unwrap();
        owners.entry(id).or_default().push(node);
    }
    // Scans go on; a second taker would show up here.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok((node, id)) = adopted.try_recv() {
        owners.entry(id).or_default().push(node);
    }
    stop.cancel();
    for task in survivors {
        task.await.unwrap();
    }
    for id in &recorded {
        assert_eq!(owners.get(id).map(Vec::len), Some(1), "{id}: {owners:?}");
    }
    // The lost node, back, owns none of them any more; its notes change nothing.
    assert!(a.unfinished().await.unwrap().is_empty());
    a.park(&recorded[0], "no_workers").await.unwrap();
    assert!(matches!(
        a.get(&recorded[0]).await.unwrap().unwrap().state,
        DispatchState::Queued { .. }
    ));
}

#[tokio::test]
async fn a_full_dispatches_bucket_refuses_naming_store_max_bytes_and_nats_down_names_the_url() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let config = ClusterConfig::new(nats.url(), "full", "a");
    let small = JetStreamStore::open(
        &config,
        JetStreamLimits {
            max_bytes: 4096,
            ..LIMITS
        },
    )
    .await
    .expect("the store opens");
    let input = "x".repeat(1000);
    let mut refused = None;
    for _ in 0..10 {
        if let Err(error) = small.record(dispatch("ns", &input, None)).await {
            refused = Some(error);
            break;
        }
    }
    let refused = refused.expect("a 4 KiB bucket refuses ten 1 KB dispatches");
    assert!(
        matches!(
            refused,
            switchyard_core::DispatchStoreError::StoreFull { limit: 4096, .. }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("store.max_bytes"), "{refused}");
    // Control: a dispatch of the other bound's size is taken by a roomy store.
    let roomy = store(&nats, "roomy", "a").await;
    assert!(roomy.record(dispatch("ns", &input, None)).await.is_ok());
    nats.kill();
    // The same store, NATS gone: once its connection knows, a new dispatch is refused as
    // unavailable without a request that could time out after recording it.
    let during = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let attempt = roomy.record(dispatch("ns", &input, None));
            match tokio::time::timeout(std::time::Duration::from_millis(200), attempt).await {
                Ok(Err(error)) if error.to_string().contains("not connected") => return error,
                // A record sent before the connection noticed waits for its request's timeout.
                _ => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("the store notices NATS is gone");
    assert!(
        matches!(
            during,
            switchyard_core::DispatchStoreError::Unavailable { .. }
        ),
        "{during:?}"
    );
    assert_eq!(
        during.to_string(),
        "dispatch store unavailable: jetstream: not connected to NATS; nothing was recorded"
    );
    let down = JetStreamStore::open(&config, LIMITS)
        .await
        .expect_err("no NATS, no store");
    let text = down.to_string();
    assert!(text.contains(&nats.url()), "names the URL: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_not_driving_a_dispatch_waits_for_the_outcome_another_node_records() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "await", "a").await,
        store(&nats, "await", "b").await,
    );
    let id = a
        .record(dispatch("ns", "slow", None))
        .await
        .unwrap()
        .id()
        .clone();
    // b starts waiting before a records the outcome (a records it a moment later).
    let (heard, recorded) = tokio::join!(b.await_recorded(&id, Duration::from_secs(30)), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        a.complete(&id, &outcome("a's"), SystemTime::now()).await
    });
    assert_eq!(recorded, Ok(Completion::Recorded));
    let row = heard.unwrap().expect("b hears a's outcome within its wait");
    assert_eq!(finished_with(&row), Some(&outcome("a's")));
    // An outcome recorded before the call is answered at once.
    let again = b
        .await_recorded(&id, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        again.as_ref().and_then(finished_with),
        Some(&outcome("a's"))
    );
    // Control: a dispatch nobody finishes has no outcome at the end of the wait.
    let open = a
        .record(dispatch("ns", "never", None))
        .await
        .unwrap()
        .id()
        .clone();
    assert_eq!(
        b.await_recorded(&open, Duration::from_millis(200)).await,
        Ok(None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_hears_the_outcomes_every_other_node_records_and_not_its_own() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "hear", "a").await,
        store(&nats, "hear", "b").await,
    );
    let mut on_b = b.recorded_elsewhere().expect("a cluster store has peers");
    let at = SystemTime::now();
    let finish = async |node: &JetStreamStore, text: &str| {
        let id = node
            .record(dispatch("ns", text, None))
            .await
            .unwrap()
            .id()
            .clone();
        node.complete(&id, &outcome(text), at).await.unwrap();
        id
    };
    let by_a = finish(&a, "a1").await;
    let _by_b = finish(&b, "b1").await;
    let by_a_again = finish(&a, "a2").await;
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), on_b.recv())
            .await
            .expect("b hears a's outcome")
            .expect("the feed runs")
    };
    let first = next().await;
    assert_eq!(first.dispatch.id, by_a);
    assert_eq!(finished_with(&first), Some(&outcome("a1")));
    // Control: b's own outcome (recorded between a's two) is not among them.
    assert_eq!(next().await.dispatch.id, by_a_again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_queued_per_namespace_holds_across_nodes_submitting_at_once() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let limits = JetStreamLimits {
        max_queued_per_namespace: 5,
        ..LIMITS
    };
    let open = |node: &'static str| {
        let config = ClusterConfig::new(nats.url(), "quota", node);
        async move { JetStreamStore::open(&config, limits).await.unwrap() }
    };
    let (a, b) = (open("a").await, open("b").await);
    let submissions = (0..8)
        .flat_map(|n| [&a, &b].map(|node| node.record(dispatch("ns", &format!("{n}"), None))));
    let results = futures::future::join_all(submissions).await;
    let admitted: Vec<DispatchId> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|r| r.id().clone()))
        .collect();
    assert_eq!(admitted.len(), 5, "16 at once on two nodes: {results:?}");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(
            refused.to_string(),
            "`store.max_queued_per_namespace` (5) reached for namespace \"ns\"",
        );
    }
    // Control: another namespace has its own count.
    assert!(b.record(dispatch("other", "x", None)).await.is_ok());
    // An outcome (recorded by a node other than the submitter) frees one place, once.
    b.complete(&admitted[0], &outcome("done"), SystemTime::now())
        .await
        .unwrap();
    a.complete(&admitted[0], &outcome("again"), SystemTime::now())
        .await
        .unwrap();
    assert!(a.record(dispatch("ns", "freed", None)).await.is_ok());
    assert!(matches!(
        b.record(dispatch("ns", "full again", None)).await,
        Err(switchyard_core::DispatchStoreError::QueueFull { limit: 5, .. })
    ));
    // A refused submission does not keep its idempotency key.
    let keyed = a.record(dispatch("ns", "k", Some("order-9"))).await;
    assert!(keyed.is_err(), "{keyed:?}");
    b.complete(&admitted[1], &outcome("done"), SystemTime::now())
        .await
        .unwrap();
    let retried = b
        .record(dispatch("ns", "k", Some("order-9")))
        .await
        .unwrap();
    assert!(matches!(retried, Recorded::New(_)), "{retried:?}");
}

/// `docs/cluster.md`, "Durable dispatches in a cluster": a node's watch of the outcomes bucket
/// that breaks (NATS restarted) watches again from the revision after the last it saw: the
/// outcome recorded after the break is heard, once, and none before it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_outcome_watch_resumes_after_the_last_outcome_it_saw() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        store(&nats, "rewatch", "a").await,
        store(&nats, "rewatch", "b").await,
    );
    let mut on_b = b.recorded_elsewhere().expect("a cluster store has peers");
    let at = SystemTime::now();
    // Records a finished dispatch on `a`, retrying while its connection comes back.
    let finish = async |text: &str| {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let recorded = match a.record(dispatch("ns", text, None)).await {
                    Ok(recorded) => recorded.id().clone(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                loop {
                    match a.complete(&recorded, &outcome(text), at).await {
                        Ok(_) => return recorded,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        })
        .await
        .expect("a records once NATS is back")
    };
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), on_b.recv())
            .await
            .expect("b hears a's outcome")
            .expect("the feed runs")
            .dispatch
            .id
    };
    let before = finish("before").await;
    assert_eq!(next().await, before);
    nats.restart();
    let after = finish("after").await;
    let control = finish("control").await;
    // The first outcome heard after the break is the one recorded after it, then the next:
    // nothing seen before is heard again, nothing after is missed.
    assert_eq!(next().await, after);
    assert_eq!(next().await, control);
}

/// The cluster's dispatches bucket, opened as any client would.
async fn dispatches_bucket(nats: &NatsServer, cluster: &str) -> async_nats::jetstream::kv::Store {
    let client = async_nats::connect(nats.url()).await.unwrap();
    async_nats::jetstream::new(client)
        .get_key_value(format!("switchyard_{cluster}_dispatches"))
        .await
        .unwrap()
}

/// A node that stopped between recording a dispatch's outcome and deleting its entry left the
/// entry behind: the next scan that meets it, a restart's or a takeover's, sees the outcome,
/// deletes the entry and drives nothing; an unfinished dispatch beside it is driven as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_left_behind_after_its_outcome_is_deleted_by_the_next_scan_and_not_run() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let cluster = "leftover";
    let a = store(&nats, cluster, "a").await;
    let done = a
        .record(dispatch("ns", "done", None))
        .await
        .unwrap()
        .id()
        .clone();
    let open = a
        .record(dispatch("ns", "open", None))
        .await
        .unwrap()
        .id()
        .clone();
    let bucket = dispatches_bucket(&nats, cluster).await;
    let entry = bucket
        .get(done.as_str())
        .await
        .unwrap()
        .expect("the recorded dispatch has its entry");
    assert_eq!(
        a.complete(&done, &outcome("first"), SystemTime::now())
            .await
            .unwrap(),
        Completion::Recorded
    );
    // The stop between the two writes: the outcome is recorded, the entry is still there.
    let leave_behind = || async {
        bucket.put(done.as_str(), entry.clone()).await.unwrap();
        assert!(
            bucket.get(done.as_str()).await.unwrap().is_some(),
            "the leftover entry is in place before the scan"
        );
    };
    leave_behind().await;
    let ids = |rows: Vec<StoredDispatch>| -> Vec<DispatchId> {
        rows.into_iter().map(|r| r.dispatch.id).collect()
    };

    // A restart of node a: its scan resumes the open dispatch only and deletes the leftover.
    drop(a);
    let a = store(&nats, cluster, "a").await;
    assert_eq!(ids(a.unfinished().await.unwrap()), vec![open.clone()]);
    assert!(
        bucket.get(done.as_str()).await.unwrap().is_none(),
        "the restart's scan deleted the leftover entry"
    );
    let row = a.get(&done).await.unwrap().expect("the outcome stays");
    assert_eq!(finished_with(&row), Some(&outcome("first")));

    // The same state met by a takeover: a is lost (not in the membership bucket), b scans.
    leave_behind().await;
    drop(a);
    members(&nats, cluster, &["b"]).await;
    let b = store(&nats, cluster, "b").await;
    let (adopted_tx, mut adopted) = tokio::sync::mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scanning = {
        let stop = stop.clone();
        tokio::spawn(async move {
            b.take_over_lost_nodes(
                Duration::from_millis(100),
                move |rows| {
                    for row in rows {
                        adopted_tx.send(row.dispatch.id).unwrap();
                    }
                },
                stop,
            )
            .await;
        })
    };
    let first = tokio::time::timeout(Duration::from_secs(30), adopted.recv())
        .await
        .expect("b takes the open dispatch over")
        .unwrap();
    assert_eq!(first, open, "the open dispatch is taken over");
    assert!(
        bucket.get(done.as_str()).await.unwrap().is_none(),
        "the takeover's scan deleted the leftover entry"
    );
    stop.cancel();
    scanning.await.unwrap();
    assert!(
        adopted.try_recv().is_err(),
        "the finished dispatch was taken over too"
    );
}

/// `cluster.nats_url` may list several servers, comma-separated: a node reaches the one that
/// answers whichever place it has in the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comma_separated_nats_url_reaches_the_server_that_answers() {
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("nats://{}", listener.local_addr().unwrap())
    };
    // Both orders: a node that took only the first or only the last URL fails one of them.
    for (n, url) in [
        format!("{dead},{}", nats.url()),
        format!("{},{dead}", nats.url()),
    ]
    .into_iter()
    .enumerate()
    {
        let store =
            JetStreamStore::open(&ClusterConfig::new(&url, "urls", format!("n{n}")), LIMITS)
                .await
                .unwrap_or_else(|error| panic!("{url}: {error}"));
        let recorded = store.record(dispatch("ns", "listed", None)).await;
        assert!(recorded.is_ok(), "{url}: {recorded:?}");
    }
}

/// `cluster.tls_ca`, `cluster.tls_cert` and `cluster.tls_key` against a nats-server that
/// requires TLS and a client certificate: with all three the node connects; without its
/// certificate, or without the CA its server's certificate chains to, it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_over_tls_takes_the_ca_and_the_client_certificate() {
    let ca = switchyard_test_support::TestCa::new("nats test ca");
    let Some(nats) = NatsServer::start_tls(&ca, true) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("switchyard-nats-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = ClusterConfig::new(nats.url(), "tls", "a");
    config.tls_ca_file = Some(ca.write_to(&dir, "ca.pem"));
    config.tls_client = Some(ca.client("node-a").write_to(&dir, "a.pem", "a-key.pem"));
    let store = JetStreamStore::open(&config, LIMITS)
        .await
        .expect("the store opens over TLS");
    assert!(store.record(dispatch("ns", "tls", None)).await.is_ok());
    // Controls: the server refuses a node without a client certificate, and a node without
    // the CA does not trust the server.
    let without_certificate = ClusterConfig {
        tls_client: None,
        ..config.clone()
    };
    assert!(
        JetStreamStore::open(&without_certificate, LIMITS)
            .await
            .is_err()
    );
    let without_ca = ClusterConfig {
        tls_ca_file: None,
        ..config
    };
    assert!(JetStreamStore::open(&without_ca, LIMITS).await.is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
