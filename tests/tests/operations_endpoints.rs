//! The operations listener answers health, readiness, Prometheus metrics (with the per-pool
//! gauges computed at scrape time) and the read-only JSON views.

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_proto::v1 as pb;
use switchyard_tests::{ScriptedTransport, TestGateway, http_get, registration};
use tokio::time::{Duration, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_json_views_answer() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let ops = gateway.gateway().ops_addr().expect("ops enabled");

    assert_eq!(
        http_get(ops, "/healthz").await.unwrap(),
        (200, "ok\n".to_owned())
    );
    let (status, body) = http_get(ops, "/readyz").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "ready\n"),
        "every transport listens"
    );

    let worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["metrics"], &["echo"], Some(4)),
            true,
        )
        .await
        .unwrap();
    let worker_id = worker.id().get();
    let _serving = worker.serve_echo();
    let mut client = gateway.client(None).await;
    let reply = client
        .dispatch(pb::DispatchRequest {
            namespace: "metrics".to_owned(),
            activity_type: "echo".to_owned(),
            input: Bytes::from_static(b"x"),
            timeout_ms: 10_000,
            ..pb::DispatchRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        reply.outcome.and_then(|o| o.outcome),
        Some(pb::dispatch_outcome::Outcome::Completed(_))
    ));

    // A dispatch parked on a queue nobody serves, left waiting while we scrape.
    let mut parked_client = client.clone();
    let parked = tokio::spawn(async move {
        parked_client
            .dispatch(pb::DispatchRequest {
                namespace: "nobody".to_owned(),
                activity_type: "echo".to_owned(),
                timeout_ms: 30_000,
                ..pb::DispatchRequest::default()
            })
            .await
    });
    timeout(Duration::from_secs(10), async {
        // Parking raises no event; poll the dispatcher's book.
        while gateway
            .gateway()
            .core()
            .dispatcher()
            .unserved_queues()
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the dispatch parks");

    let (status, metrics) = http_get(ops, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for expected in [
        "switchyard_dispatches_total{outcome=\"completed\"}",
        "switchyard_dispatch_latency_seconds_bucket",
        "switchyard_workers_connected{",
        "switchyard_pool_capacity{namespace=\"metrics\",task_queue=\"default\"} 4",
        "switchyard_pool_workers{namespace=\"metrics\",task_queue=\"default\"} 1",
        "switchyard_pool_in_flight{namespace=\"metrics\",task_queue=\"default\"} 0",
        "switchyard_parked_dispatches{reason=\"no_workers\"} 1",
        "switchyard_pool_parked_dispatches{namespace=\"nobody\",task_queue=\"default\"} 1",
        "switchyard_pool_oldest_parked_seconds{namespace=\"nobody\",task_queue=\"default\"}",
    ] {
        assert!(
            metrics.contains(expected),
            "/metrics lacks {expected}:\n{metrics}"
        );
    }

    let (status, workers) = http_get(ops, "/v1/workers").await.unwrap();
    assert_eq!(status, 200);
    let workers: serde_json::Value = serde_json::from_str(&workers).unwrap();
    assert_eq!(workers["workers"][0]["worker_id"], worker_id);
    assert_eq!(workers["workers"][0]["transport"], "scripted");

    let (_, pools) = http_get(ops, "/v1/pools").await.unwrap();
    let pools: serde_json::Value = serde_json::from_str(&pools).unwrap();
    let names: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["namespace"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["metrics", "nobody"]);

    let (_, unserved) = http_get(ops, "/v1/unserved").await.unwrap();
    let unserved: serde_json::Value = serde_json::from_str(&unserved).unwrap();
    assert_eq!(unserved["unserved"][0]["namespace"], "nobody");
    assert_eq!(unserved["unserved"][0]["reason"], "no_workers");
    assert_eq!(unserved["unserved"][0]["waiting"], 1);
    parked.abort();
}
