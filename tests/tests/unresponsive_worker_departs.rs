//! `docs/security.md`, `dispatch.max_unresponsive_tasks`: a worker that keeps hanging (answers
//! pings, never answers its tasks nor acknowledges their cancels) reaches the limit, is
//! deregistered with reason `unresponsive`, and its leaving is counted in
//! `switchyard_worker_departures_total{reason="unresponsive"}`. A file of its own: the metrics
//! recorder is the process's, and the hung-handler tests count reclaims in it.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{RawGrpcWorker, TestGateway, counter, raw_registration};

const NS: &str = "unresponsive";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_at_the_unresponsive_limit_leaves_and_is_counted_as_unresponsive() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.dispatch.cancel_ack_timeout = ConfigDuration::millis(200);
        config.dispatch.max_unresponsive_tasks = 1;
    })
    .await;
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    let departed = || async {
        counter(
            ops,
            "switchyard_worker_departures_total",
            "reason=\"unresponsive\"",
        )
        .await
        .expect("/metrics")
    };
    // Control: nothing has left as unresponsive before this worker hangs.
    assert_eq!(departed().await, 0);
    let mut worker = RawGrpcWorker::open(&gateway).await.expect("call opens");
    worker.register(raw_registration(NS, "work", 1)).await;
    // The worker answers pings and reports how its stream ended; its task it never answers.
    let serving = tokio::spawn(async move {
        loop {
            match worker.next_frame().await {
                Ok(Some(_)) => {}
                other => return other,
            }
        }
    });
    let hung = gateway
        .client(None)
        .await
        .dispatch(pb::DispatchRequest {
            namespace: NS.to_owned(),
            activity_type: "work".to_owned(),
            input: Bytes::from_static(b"hang"),
            timeout_ms: 300,
            ..pb::DispatchRequest::default()
        })
        .await
        .expect("an OK reply")
        .into_inner();
    assert!(matches!(
        hung.outcome.and_then(|o| o.outcome),
        Some(Outcome::TimedOut(_))
    ));
    // Its stream ends once the reclaim makes it unresponsive: the gateway let go of it.
    let ended = tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the worker's stream ends within 10 s")
        .expect("joined");
    assert!(!matches!(ended, Ok(Some(_))), "{ended:?}");
    assert_eq!(departed().await, 1);
}
