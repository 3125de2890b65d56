//! Quotas on what a producer or a worker churn can make the gateway hold: the refusal is
//! `RESOURCE_EXHAUSTED`, names the configuration key and is counted on `/metrics`, and room
//! returns once the pressure ends.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::v1 as pb;
use switchyard_tests::{RawGrpcWorker, TestGateway, counter, raw_registration};
use tonic::Code;

const NS: &str = "quota";
const PATIENCE: Duration = Duration::from_secs(10);

fn request(activity_id: &str, input: &'static [u8]) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: "nobody-serves-this".to_owned(),
        input: Bytes::from_static(input),
        activity_id: activity_id.to_owned(),
        timeout_ms: 30_000,
        ..pb::DispatchRequest::default()
    }
}

/// The counter `name` with the label `label` on the gateway's `/metrics`. Each label counted
/// here is refused by one test only, so the tests of this file, sharing the process's
/// recorder, do not count into each other's series.
async fn counted(gateway: &TestGateway, name: &str, label: &str) -> u64 {
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    counter(ops, name, label).await.expect("/metrics")
}

/// Waits (bounded) until `n` dispatches are parked.
async fn parked(gateway: &TestGateway, n: usize) {
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let waiting: usize = dispatcher.unserved_queues().iter().map(|q| q.waiting).sum();
            if waiting == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} dispatches never parked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_past_the_parked_quota_is_resource_exhausted_naming_the_key() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.dispatch.max_parked_per_namespace = 2;
    })
    .await;
    let client = gateway.client(None).await;
    let waiting: Vec<_> = ["p1", "p2"]
        .into_iter()
        .map(|id| {
            let mut producer = client.clone();
            tokio::spawn(async move { producer.dispatch(request(id, b"x")).await })
        })
        .collect();
    parked(&gateway, 2).await;
    let series = (
        "switchyard_dispatch_refusals_total",
        "limit=\"dispatch.max_parked_per_namespace\"",
    );
    let before = counted(&gateway, series.0, series.1).await;

    let refused = client
        .clone()
        .dispatch(request("p3", b"x"))
        .await
        .expect_err("a third parked dispatch");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("`dispatch.max_parked_per_namespace` (2)"),
        "{}",
        refused.message()
    );
    assert_eq!(counted(&gateway, series.0, series.1).await, before + 1);

    // Control: once the parked ones are cancelled, the same dispatch is accepted and parks.
    for id in ["p1", "p2"] {
        client
            .clone()
            .cancel(pb::CancelDispatchRequest {
                namespace: NS.to_owned(),
                activity_id: id.to_owned(),
                ..pb::CancelDispatchRequest::default()
            })
            .await
            .expect("cancelled");
    }
    for running in waiting {
        running.await.expect("joined").expect("an OK reply");
    }
    let mut producer = client.clone();
    let accepted = tokio::spawn(async move { producer.dispatch(request("p3", b"x")).await });
    parked(&gateway, 1).await;
    accepted.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_past_the_held_bytes_quota_is_resource_exhausted_naming_the_key() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.dispatch.max_held_input_bytes_per_namespace = 8;
    })
    .await;
    let client = gateway.client(None).await;
    let series = (
        "switchyard_dispatch_refusals_total",
        "limit=\"dispatch.max_held_input_bytes_per_namespace\"",
    );
    let before = counted(&gateway, series.0, series.1).await;
    let refused = client
        .clone()
        .dispatch(request("big", b"123456789"))
        .await
        .expect_err("nine bytes past a quota of eight");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("`dispatch.max_held_input_bytes_per_namespace` (8)"),
        "{}",
        refused.message()
    );
    assert_eq!(counted(&gateway, series.0, series.1).await, before + 1);
    // Control: an input within the quota is accepted (it parks, no worker serves it).
    let mut producer = client.clone();
    let fits = tokio::spawn(async move { producer.dispatch(request("fits", b"12345678")).await });
    parked(&gateway, 1).await;
    fits.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_into_a_namespace_past_the_cap_is_resource_exhausted_naming_the_key() {
    let gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.registry.max_namespaces = 1;
    })
    .await;
    let mut first = RawGrpcWorker::open(&gateway).await.expect("call opens");
    first.register(raw_registration("first", "work", 1)).await;
    // Control: another worker in the namespace already live takes no room.
    let mut same = RawGrpcWorker::open(&gateway).await.expect("call opens");
    same.register(raw_registration("first", "work", 1)).await;

    let series = (
        "switchyard_admission_refusals_total",
        "reason=\"namespace_limit\"",
    );
    let before = counted(&gateway, series.0, series.1).await;
    let mut second = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let refused = second
        .try_register(raw_registration("second", "work", 1))
        .await
        .expect_err("a second live namespace");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("`registry.max_namespaces` (1)"),
        "{}",
        refused.message()
    );
    assert_eq!(counted(&gateway, series.0, series.1).await, before + 1);
}
