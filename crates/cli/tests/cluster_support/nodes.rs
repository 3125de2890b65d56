//! What the cluster end-to-end tests share: a node's site on a NATS server, an ephemeral
//! dispatch through a node, the operations listener and its endpoints, and waiting until a
//! node takes offers. Include it next to `durable_support/harness.rs` (as `mod harness`).
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    dead_code,
    unreachable_pub
)]

use std::time::Duration;

use switchyard_proto::v1 as pb;
use switchyard_test_support::NatsServer;

use crate::harness::{self, NAMESPACE, PATIENCE, Process, Site, tagged};

/// A node's site: `[cluster]` on `nats` as `node` of cluster `cluster`, with a 3 s membership
/// TTL refreshed every second so a killed node is noticed quickly.
pub fn node_site(nats: &NatsServer, cluster: &str, node: &str) -> Site {
    node_site_at(&nats.url(), cluster, node)
}

/// [`node_site`] reaching NATS at `nats_url` (a relay in front of the server, say).
pub fn node_site_at(nats_url: &str, cluster: &str, node: &str) -> Site {
    node_site_with(nats_url, cluster, node, "")
}

/// [`node_site_at`] with `more` lines in its `[cluster]` section.
pub fn node_site_with(nats_url: &str, cluster: &str, node: &str, more: &str) -> Site {
    Site::with_store(&format!(
        "\n[cluster]\nnats_url = \"{nats_url}\"\nname = \"{cluster}\"\nnode = \"{node}\"\n\
         member_ttl = \"3s\"\nrefresh_every = \"1s\"\n{more}"
    ))
}

/// Nodes `a` (the producers') and `c` of cluster `cluster` on `nats`, both serving, `c` with
/// its operations listener on `c_ops`; each node is killed when its process is dropped.
pub struct TwoNodes {
    pub a: Site,
    pub c: Site,
    pub a_node: Process,
    pub c_node: Process,
    pub c_ops: u16,
}

/// Starts [`TwoNodes`].
pub async fn two_nodes(nats: &NatsServer, cluster: &str) -> TwoNodes {
    let (a, c) = (node_site(nats, cluster, "a"), node_site(nats, cluster, "c"));
    let a_node = a.serve().await;
    let (c_node, c_ops) = serve_with_ops(&c).await;
    TwoNodes {
        a,
        c,
        a_node,
        c_node,
        c_ops,
    }
}

/// An ephemeral dispatch of `activity` with input [`tagged`]`(tag)` through `site`.
pub async fn dispatch(
    site: &Site,
    activity: &str,
    tag: u64,
    timeout: Duration,
) -> pb::DispatchOutcome {
    let mut producer = site.producer().await.expect("the node listens");
    producer
        .0
        .dispatch(pb::DispatchRequest {
            namespace: NAMESPACE.into(),
            activity_type: activity.into(),
            input: tagged(tag),
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap(),
            durable: Some(false),
            ..pb::DispatchRequest::default()
        })
        .await
        .expect("Dispatch answers")
        .into_inner()
        .outcome
        .expect("an outcome")
}

/// The output of a completed outcome.
pub fn completed(outcome: &pb::DispatchOutcome) -> Option<&[u8]> {
    match &outcome.outcome {
        Some(pb::dispatch_outcome::Outcome::Completed(done)) => Some(&done.output),
        _ => None,
    }
}

/// The reason of an unserved outcome.
pub fn unserved_reason(outcome: &pb::DispatchOutcome) -> Option<pb::UnservedReason> {
    match &outcome.outcome {
        Some(pb::dispatch_outcome::Outcome::Unserved(unserved)) => Some(unserved.reason()),
        _ => None,
    }
}

/// `GET path` on a loopback HTTP port: the whole response, headers and body.
pub async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("ops listens");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
        .await
        .expect("ops answers")
        .unwrap();
    response
}

/// Polls `GET path` until `done(response)`, within the patience; returns that response.
pub async fn http_until_with(port: u16, path: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let response = http_get(port, path).await;
        if done(&response) {
            return response;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never got there: {response}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `GET path` until the response contains `needle`, within the patience.
pub async fn http_until(port: u16, path: &str, needle: &str) -> String {
    http_until_with(port, path, |response| response.contains(needle)).await
}

/// The value of the first sample of `metric` in a `/metrics` response (0 when absent).
pub fn sample(metrics: &str, metric: &str) -> f64 {
    metrics
        .lines()
        .find(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

/// Waits until the node whose operations listener is `ops` is subscribed for offers in at
/// least one pool (`switchyard_cluster_offer_pools`), so an offer from another node reaches it.
pub async fn takes_offers(ops: u16) {
    http_until_with(ops, "/metrics", |metrics| {
        sample(metrics, "switchyard_cluster_offer_pools") >= 1.0
    })
    .await;
}

/// Waits until the nodes whose operations listeners are `ops` are subscribed for offers in
/// `pools` pools in all (a full node leaves its pool's offer group).
pub async fn offer_pools_in_all(ops: &[u16], pools: f64) {
    let counted = tokio::time::timeout(harness::PATIENCE, async {
        loop {
            let mut sum = 0.0;
            for port in ops {
                sum += sample(
                    &http_get(*port, "/metrics").await,
                    "switchyard_cluster_offer_pools",
                );
            }
            if sum == pools {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "the nodes {ops:?} never took offers in {pools} pools in all"
    );
}

/// `switchyard serve` on `site` with the operations listener on a fresh port; returns it and
/// the port, once the banner is out.
pub async fn serve_with_ops(site: &Site) -> (Process, u16) {
    let (mut node, ops) = spawn_with_ops(site);
    node.line_containing("grpc").await;
    (node, ops)
}

/// [`serve_with_ops`] without waiting for the banner.
pub fn spawn_with_ops(site: &Site) -> (Process, u16) {
    let ops = harness::free_port();
    let mut command = std::process::Command::new(harness::switchyard());
    command
        .arg("serve")
        .arg("--config")
        .arg(&site.config)
        .env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SWITCHYARD_") {
            command.env_remove(name);
        }
    }
    command
        .env("SWITCHYARD_OPS_ENABLED", "true")
        .env("SWITCHYARD_OPS_LISTEN", format!("127.0.0.1:{ops}"));
    (Process::spawn(&mut command), ops)
}

/// Whether an HTTP response is a 200.
pub fn is_ok(response: &str) -> bool {
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}
