//! Cluster-wide views and drains end to end: three `switchyard serve` nodes joined over one
//! real `nats-server -js` on loopback, workers with node labels on B and C, and the views and
//! a drain asked on A (and `switchyard workers` asked on every node).
//!
//! The membership TTL is 10 s (refreshed every second), so a node killed mid-test is still a
//! member, and asked, for a while: that is the "silent node" case.
//!
//! Skipped with a printed reason when nats-server is missing, unless `CI_REQUIRE_NATS` is set.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

#[path = "cluster_support/event_stream.rs"]
mod event_stream;
#[path = "durable_support/harness.rs"]
mod harness;
#[path = "cluster_support/nodes.rs"]
mod nodes;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use event_stream::EventStream;
use harness::{NAMESPACE, PATIENCE, Process, Site, free_port, switchyard};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;
use switchyard_transport_grpc::{ActivityContext, GrpcWorker};
use tokio_util::sync::CancellationToken;

const ACTIVITY: &str = "views-echo";

/// A node's site: `[cluster]` on `nats` as `node` of cluster `cluster`.
fn node_site(nats: &NatsServer, cluster: &str, node: &str) -> Site {
    Site::with_store(&format!(
        "\n[cluster]\nnats_url = \"{}\"\nname = \"{cluster}\"\nnode = \"{node}\"\n\
         member_ttl = \"10s\"\nrefresh_every = \"1s\"\n",
        nats.url()
    ))
}

/// Turns on `site`'s operations listener on a free loopback port (the harness leaves it
/// off) and returns its address.
fn enable_ops(site: &Site) -> SocketAddr {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = std::fs::read_to_string(&site.config).unwrap();
    let on = config.replace(
        "[ops]\nenabled = false",
        &format!("[ops]\nlisten = \"{addr}\""),
    );
    assert_ne!(
        on, config,
        "the harness configuration has an [ops] table to turn on"
    );
    std::fs::write(&site.config, on).unwrap();
    addr
}

/// `GET path` on an operations listener, as JSON.
async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// A worker of [`ACTIVITY`] on `site` advertising the node label `label`; stops with the token.
async fn labelled_worker(site: &Site, label: &str) -> CancellationToken {
    let worker = GrpcWorker::builder(format!("https://localhost:{}", site.port))
        .namespaces([NAMESPACE])
        .node(label)
        .max_concurrency(2)
        .tls(site.client_tls())
        .activity(ACTIVITY, |_: ActivityContext, input: Bytes| async move {
            Ok(input)
        })
        .connect()
        .await
        .expect("the worker registers");
    let stop = worker.shutdown_token();
    tokio::spawn(async move {
        let _ = worker.run().await;
    });
    stop
}

async fn list(site: &Site) -> pb::ListWorkersReply {
    site.producer()
        .await
        .expect("the node listens")
        .0
        .list_workers(pb::ListWorkersRequest::default())
        .await
        .expect("ListWorkers answers")
        .into_inner()
}

/// Waits until `site` lists `count` workers across the cluster.
async fn until_listed(site: &Site, count: usize) -> pb::ListWorkersReply {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let reply = list(site).await;
            if reply.workers.len() == count && reply.silent_nodes.is_empty() {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("every node's workers are listed")
}

/// `switchyard workers` against `site`: its standard output and error.
fn cli_workers(site: &Site) -> (String, String) {
    cli(site, "workers")
}

/// The client command `subcommand` against `site`: its standard output and error.
fn cli(site: &Site, subcommand: &str) -> (String, String) {
    let mut command = Command::new(switchyard());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SWITCHYARD_") {
            command.env_remove(name);
        }
    }
    let output = command
        .arg(subcommand)
        .args(["--endpoint", &format!("https://127.0.0.1:{}", site.port)])
        .arg("--data-dir")
        .arg(&site.data_dir)
        .output()
        .expect("the client runs");
    assert!(output.status.success(), "{output:?}");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Rows of a `switchyard workers` table (without its header) naming `gateway` first.
fn rows_on(table: &str, gateway: &str) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|line| line.split_whitespace().next() == Some(gateway))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_and_a_drain_asked_on_a_cover_the_workers_on_b_and_c() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, "views", "a"),
        node_site(&nats, "views", "b"),
        node_site(&nats, "views", "c"),
    );
    let ops_a = enable_ops(&a);
    let mut nodes: Vec<Process> = vec![a.serve().await, b.serve().await, c.serve().await];
    let on_b = labelled_worker(&b, "rack-b").await;
    let on_c = [
        labelled_worker(&c, "rack-c").await,
        labelled_worker(&c, "rack-c").await,
    ];

    // ListWorkers on A lists every node's workers, each with its gateway node.
    let listed = until_listed(&a, 3).await;
    let gateways: Vec<&str> = listed
        .workers
        .iter()
        .map(|w| w.gateway_node.as_str())
        .collect();
    assert_eq!(gateways, ["b", "c", "c"], "{listed:?}");

    // `/v1/workers` on A's operations listener too, paged after the merge.
    let all = get_json(ops_a, "/v1/workers").await;
    let gateways: Vec<&str> = all["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["gateway_node"].as_str().unwrap())
        .collect();
    assert_eq!(gateways, ["b", "c", "c"], "{all}");
    assert_eq!(all["silent_nodes"], Value::Array(vec![]), "{all}");
    let page = get_json(ops_a, "/v1/workers?offset=1&limit=1").await;
    assert_eq!(page["total"], 3, "{page}");
    assert_eq!(page["workers"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["workers"][0]["gateway_node"], "c", "{page}");
    let pools = get_json(ops_a, "/v1/pools").await;
    let workers_by_node: Vec<(&str, u64)> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["gateway_node"].as_str().unwrap(),
                p["workers"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(workers_by_node, [("b", 1), ("c", 2)], "{pools}");
    // `/v1/explain` on A explains the pool's workers on B and C (A has none of its own).
    let explained = get_json(
        ops_a,
        &format!("/v1/explain?namespace={NAMESPACE}&activity_type={ACTIVITY}"),
    )
    .await;
    let explained_on: Vec<&str> = explained["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["gateway_node"].as_str().unwrap())
        .collect();
    assert_eq!(explained_on, ["b", "c", "c"], "{explained}");
    assert_eq!(explained["activity_type"], ACTIVITY, "{explained}");

    // ExplainPool from A explains every node's workers.
    let explained = a
        .producer()
        .await
        .unwrap()
        .0
        .explain_pool(pb::ExplainPoolRequest {
            namespace: NAMESPACE.into(),
            activity_type: ACTIVITY.into(),
            ..pb::ExplainPoolRequest::default()
        })
        .await
        .expect("ExplainPool answers")
        .into_inner();
    let explained_on: Vec<&str> = explained
        .workers
        .iter()
        .map(|w| w.worker.as_ref().unwrap().gateway_node.as_str())
        .collect();
    assert_eq!(explained_on, ["b", "c", "c"], "{explained:?}");

    // `switchyard workers` on each node lists all three, with a GATEWAY column.
    for site in [&a, &b, &c] {
        until_listed(site, 3).await;
        let (table, warnings) = cli_workers(site);
        assert!(table.starts_with("GATEWAY"), "{table}");
        assert_eq!(
            (rows_on(&table, "b"), rows_on(&table, "c")),
            (1, 2),
            "{table}"
        );
        assert!(!warnings.contains("did not answer"), "{warnings}");
    }

    // A pool described from A counts the workers on B and C, one part per node.
    let described = a
        .producer()
        .await
        .unwrap()
        .0
        .describe_pool(pb::DescribePoolRequest {
            namespace: NAMESPACE.into(),
            activity_type: ACTIVITY.into(),
            ..pb::DescribePoolRequest::default()
        })
        .await
        .expect("DescribePool answers")
        .into_inner();
    let census = described.census.unwrap();
    assert_eq!(
        (census.pool_workers, census.compatible),
        (3, 3),
        "{described:?}"
    );
    assert!(described.served, "{described:?}");
    let parts: Vec<(&str, u32, u64)> = described
        .nodes
        .iter()
        .map(|n| {
            (
                n.gateway_node.as_str(),
                n.census.as_ref().map_or(0, |c| c.pool_workers),
                n.capacity,
            )
        })
        .collect();
    assert_eq!(parts, [("a", 0, 0), ("b", 1, 2), ("c", 2, 4)]);
    assert!(described.silent_nodes.is_empty());

    // Drain by node label issued on A drains the workers on C, and only those.
    let mut progress = a
        .producer()
        .await
        .unwrap()
        .0
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::Node("rack-c".into())),
            deadline_ms: 0,
        })
        .await
        .expect("Drain answers")
        .into_inner();
    let first = progress.message().await.unwrap().expect("a first progress");
    let drained: Vec<&str> = first
        .workers
        .iter()
        .map(|w| w.gateway_node.as_str())
        .collect();
    assert_eq!(drained, ["c", "c"], "{first:?}");
    let last = tokio::time::timeout(PATIENCE, async {
        loop {
            let step = progress
                .message()
                .await
                .unwrap()
                .expect("progress until done");
            if step.done {
                return step;
            }
        }
    })
    .await
    .expect("the drain finishes");
    assert_eq!(last.workers_left, 2, "both of C's workers left: {last:?}");
    // Control: B's worker (another label) is still there and not draining.
    let after = list(&a).await;
    let remaining: Vec<(&str, i32)> = after
        .workers
        .iter()
        .filter(|w| w.gateway_node != "c")
        .map(|w| (w.gateway_node.as_str(), w.eligibility))
        .collect();
    assert_eq!(remaining.len(), 1, "{after:?}");
    assert_eq!(remaining[0].0, "b");
    assert_ne!(
        remaining[0].1,
        pb::Eligibility::Draining as i32,
        "{after:?}"
    );

    // Drain by worker id issued on C drains exactly the worker holding that id: ids are
    // unique across the cluster, so only B's (A's worker is the control).
    let on_a = labelled_worker(&a, "rack-a").await;
    let on_c_again = labelled_worker(&c, "rack-c").await;
    let before = until_listed(&c, 3).await;
    let id = before
        .workers
        .iter()
        .find(|w| w.gateway_node == "b")
        .expect("B's worker")
        .worker_id;
    let mut holding: Vec<(String, u64)> = before
        .workers
        .iter()
        .filter(|w| w.worker_id == id)
        .map(|w| (w.gateway_node.clone(), w.worker_id))
        .collect();
    assert_eq!(holding.len(), 1, "one node holds the id: {holding:?}");
    let mut progress = c
        .producer()
        .await
        .unwrap()
        .0
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::WorkerId(id)),
            deadline_ms: 0,
        })
        .await
        .expect("Drain answers")
        .into_inner();
    let first = progress.message().await.unwrap().expect("a first progress");
    let mut drained: Vec<(String, u64)> = first
        .workers
        .iter()
        .map(|w| (w.gateway_node.clone(), w.worker_id))
        .collect();
    drained.sort();
    holding.sort();
    assert_eq!(drained, holding, "{first:?} against {before:?}");
    let last = tokio::time::timeout(PATIENCE, async {
        loop {
            let step = progress
                .message()
                .await
                .unwrap()
                .expect("progress until done");
            if step.done {
                return step;
            }
        }
    })
    .await
    .expect("the drain finishes");
    assert_eq!(last.workers_left as usize, holding.len(), "{last:?}");
    // Control: C's new worker, with another id, is untouched.
    let after = until_listed(&c, 3 - holding.len()).await;
    assert!(
        after
            .workers
            .iter()
            .any(|w| w.gateway_node == "c" && w.eligibility != pb::Eligibility::Draining as i32),
        "{after:?}"
    );

    // A node killed outright is still a member for a while: it is named as silent, and the
    // others' workers are still listed.
    nodes[2].kill_9();
    let reply = list(&a).await;
    let silent: Vec<&str> = reply.silent_nodes.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(silent, ["c"], "{reply:?}");
    assert!(
        reply.workers.iter().all(|w| w.gateway_node != "c"),
        "{reply:?}"
    );
    let (_, warnings) = cli_workers(&a);
    assert!(
        warnings.contains("cluster node c did not answer"),
        "{warnings}"
    );

    // NATS gone: A still lists its own worker and names the others silent, at once (B for
    // sure; C too while its entry has not aged out of A's view).
    let on_a_again = labelled_worker(&a, "rack-a").await;
    nats.kill();
    let degraded = tokio::time::timeout(PATIENCE, async {
        loop {
            let reply = list(&a).await;
            if reply
                .silent_nodes
                .iter()
                .any(|s| s.reason.contains("degraded"))
            {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("A notices NATS is gone");
    let listed: Vec<&str> = degraded
        .workers
        .iter()
        .map(|w| w.gateway_node.as_str())
        .collect();
    // A's two workers: the drain by B's id left A's first one alone.
    assert_eq!(listed, ["a", "a"], "{degraded:?}");
    assert!(
        degraded.silent_nodes.iter().any(|s| s.node == "b")
            && degraded
                .silent_nodes
                .iter()
                .all(|s| s.reason.contains("degraded")),
        "{degraded:?}"
    );
    for stop in [on_a, on_a_again, on_b, on_c_again].into_iter().chain(on_c) {
        stop.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cluster_each_node_lists_only_its_own_workers() {
    let (one, two) = (Site::new(), Site::new());
    let _nodes: Vec<Process> = vec![one.serve().await, two.serve().await];
    let stops = [
        labelled_worker(&one, "rack-1").await,
        labelled_worker(&two, "rack-2").await,
    ];
    for (site, label) in [(&one, "rack-1"), (&two, "rack-2")] {
        let reply = until_listed(site, 1).await;
        assert_eq!(reply.workers[0].node, label);
        assert_eq!(
            reply.workers[0].gateway_node, "",
            "no gateway node outside a cluster"
        );
        let (table, _) = cli_workers(site);
        assert!(table.starts_with("ID"), "no GATEWAY column: {table}");
        assert_eq!(table.lines().count(), 2, "its own worker only: {table}");
    }
    for stop in stops {
        stop.cancel();
    }
}

/// The dispatches of pool `(NAMESPACE, default)` in a `/v1/history` body, over its window.
fn history_dispatches(history: &Value) -> u64 {
    history["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["namespace"] == NAMESPACE)
        .flat_map(|p| p["points"].as_array().unwrap())
        .map(|point| point["dispatches"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_events_asked_on_any_node_cover_the_cluster() {
    let Some(mut nats) = NatsServer::start() else {
        return;
    };
    let (a, b, c) = (
        node_site(&nats, "history", "a"),
        node_site(&nats, "history", "b"),
        node_site(&nats, "history", "c"),
    );
    let (node_a, ops_a) = nodes::serve_with_ops(&a).await;
    let (node_b, ops_b) = nodes::serve_with_ops(&b).await;
    let mut nodes: Vec<Process> = vec![node_a, node_b, c.serve().await];
    // Every node answers B's history before anything is dispatched.
    let before = nodes::http_until_with(ops_b, "/v1/history", |response| {
        response.contains("\"silent_nodes\":[]")
    })
    .await;
    let before: Value = serde_json::from_str(before.split_once("\r\n\r\n").unwrap().1).unwrap();
    // Control: no dispatch of the pool anywhere yet, so none is shown.
    assert_eq!(history_dispatches(&before), 0, "{before}");

    // A stream on A, opened before C has a worker, follows C's events live.
    let mut live = EventStream::open(ops_a, None).await;
    let on_c = labelled_worker(&c, "rack-c").await;
    let from_c = |json: &Value| json["kind"] == "connected" && json["gateway_node"] == "c";
    let (connected, cursor) = live.until(from_c).await;
    assert!(connected["seq"].as_u64().is_some(), "{connected}");
    assert!(cursor.contains("c:"), "a per-node cursor: {cursor}");

    // A dispatch from a producer on A, served by the only worker, on C, shows on B.
    let outcome = nodes::dispatch(&a, ACTIVITY, 1, PATIENCE).await;
    assert!(nodes::completed(&outcome).is_some(), "{outcome:?}");
    let after = get_json(SocketAddr::from(([127, 0, 0, 1], ops_b)), "/v1/history").await;
    assert_eq!(history_dispatches(&after), 1, "counted once, on A: {after}");
    let pool = after["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["namespace"] == NAMESPACE)
        .unwrap();
    assert_eq!(pool["gateway_nodes"], serde_json::json!(["a"]), "{after}");

    // A new stream resuming from the cursor is not sent C's connection again; one opened
    // afresh is (control), from every node's recent events.
    let mut fresh = EventStream::open(ops_a, None).await;
    fresh.until(from_c).await;
    let mut resumed = EventStream::open(ops_a, Some(&cursor)).await;
    let on_b = labelled_worker(&b, "rack-b").await;
    let from_b = |json: &Value| json["kind"] == "connected" && json["gateway_node"] == "b";
    resumed.until(from_b).await;
    assert!(
        !resumed.events().iter().any(|(json, _)| from_c(json)),
        "resent after the cursor: {}",
        resumed.seen
    );

    // C killed: still a member for its TTL, so named silent, and A's count stays.
    on_c.cancel();
    nodes[2].kill_9();
    let silent = get_json(SocketAddr::from(([127, 0, 0, 1], ops_b)), "/v1/history").await;
    assert_eq!(silent["silent_nodes"][0]["node"], "c", "{silent}");
    assert_eq!(history_dispatches(&silent), 1, "{silent}");
    let mut opened = EventStream::open(ops_a, None).await;
    let (line, id) = opened.until(|json| json["kind"] == "silent_nodes").await;
    assert_eq!(line["silent_nodes"][0]["node"], "c", "{line}");
    assert!(id.is_empty(), "a silent_nodes line moves no cursor: {id}");

    // NATS gone: A, degraded, asks nobody and answers with its own history (the dispatch its
    // producer ran), naming the others silent as not asked.
    nats.kill();
    let degraded = tokio::time::timeout(PATIENCE, async {
        loop {
            let history = get_json(SocketAddr::from(([127, 0, 0, 1], ops_a)), "/v1/history").await;
            let reasons: Vec<&str> = history["silent_nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["reason"].as_str().unwrap())
                .collect();
            if !reasons.is_empty()
                && reasons
                    .iter()
                    .all(|r| r.starts_with("not asked: a is degraded"))
            {
                return history;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("A notices NATS is gone");
    assert_eq!(history_dispatches(&degraded), 1, "{degraded}");
    assert!(
        degraded["silent_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["node"] == "b"),
        "{degraded}"
    );
    on_b.cancel();
}

/// `docs/cluster.md`, "Cluster-wide views": `UnservedQueues`, `/v1/unserved` and `switchyard
/// unserved` asked on A list a dispatch parked on B, naming B as the node it waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_parked_on_b_is_listed_unserved_from_a() {
    const NOBODY: &str = "views-nobody";
    let Some(nats) = NatsServer::start() else {
        return;
    };
    let (a, b) = (
        node_site(&nats, "unserved", "a"),
        node_site(&nats, "unserved", "b"),
    );
    let ops_a = enable_ops(&a);
    let _nodes: Vec<Process> = vec![a.serve().await, b.serve().await];
    let unserved_on_a = || async {
        a.producer()
            .await
            .expect("A listens")
            .0
            .unserved_queues(pb::UnservedQueuesRequest {})
            .await
            .expect("UnservedQueues answers")
            .into_inner()
    };
    // Control: nothing waits yet.
    assert!(unserved_on_a().await.queues.is_empty());
    let mut on_b = b.producer().await.expect("B listens");
    let parked = tokio::spawn(async move {
        on_b.0
            .dispatch(pb::DispatchRequest {
                namespace: NAMESPACE.into(),
                activity_type: NOBODY.into(),
                input: Bytes::from_static(b"x"),
                timeout_ms: 60_000,
                ..pb::DispatchRequest::default()
            })
            .await
    });
    let row = tokio::time::timeout(PATIENCE, async {
        loop {
            let reply = unserved_on_a().await;
            if let Some(row) = reply.queues.into_iter().find(|q| q.activity_type == NOBODY) {
                return row;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("A lists the dispatch parked on B");
    assert_eq!(row.gateway_node, "b", "{row:?}");
    assert_eq!(row.waiting, 1, "{row:?}");
    assert_eq!(
        row.reason,
        pb::UnservedReason::NoCapacityInCluster as i32,
        "{row:?}"
    );
    let listed = get_json(ops_a, "/v1/unserved").await;
    let rows: Vec<(&str, &str)> = listed["unserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["activity_type"].as_str().unwrap(),
                r["gateway_node"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows, [(NOBODY, "b")], "{listed}");
    let (table, _) = cli(&a, "unserved");
    let line = table
        .lines()
        .find(|line| line.contains(NOBODY))
        .unwrap_or_else(|| panic!("`switchyard unserved` on A lacks it: {table}"));
    assert!(
        line.split_whitespace().any(|word| word == "b"),
        "names node b: {table}"
    );
    parked.abort();
}
