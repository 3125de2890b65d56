//! During the shutdown grace (what SIGTERM starts) the producer API still answers: a new
//! dispatch, on an existing connection or a new one, ends with the `shutting_down` outcome,
//! and a worker trying to register is told to come back (`UNAVAILABLE`). Once the listener
//! has closed, producers see `UNAVAILABLE` from their transport. gRPC health reports the server
//! and the API not serving from the start of the grace.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_tests::{
    RawGrpcWorker, TestGateway, api_client_at, raw_registration, success, tls_channel,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

const NS: &str = "grace";
const ACTIVITY: &str = "work";
/// Bounds every wait on a socket; the test never sleeps to synchronise.
const PATIENCE: Duration = Duration::from_secs(15);

fn request(input: &'static [u8]) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        input: Bytes::from_static(input),
        timeout_ms: 30_000,
        ..pb::DispatchRequest::default()
    }
}

fn outcome(reply: pb::DispatchReply) -> Outcome {
    reply
        .outcome
        .and_then(|o| o.outcome)
        .expect("an outcome is always set")
}

/// gRPC health `Watch` streams of the server (`""`) and of the producer API, on `addr`.
async fn health_watches(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> Vec<(&'static str, tonic::Streaming<HealthCheckResponse>)> {
    let channel = tls_channel(addr, ca_pem)
        .await
        .expect("the health channel connects");
    let mut watches = Vec::new();
    for service in ["", "switchyard.v1.Gateway"] {
        let watch = HealthClient::new(channel.clone())
            .watch(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("the watch opens")
            .into_inner();
        watches.push((service, watch));
    }
    watches
}

/// The next status a health watch reports.
async fn next_status(watch: &mut tonic::Streaming<HealthCheckResponse>) -> ServingStatus {
    let reply = tokio::time::timeout(PATIENCE, watch.message())
        .await
        .expect("a status within the patience")
        .expect("the watch answers")
        .expect("the watch is open");
    ServingStatus::try_from(reply.status).expect("a known status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_during_the_grace_gets_shutting_down_and_unavailable_after_close() {
    let mut gateway = TestGateway::start(|config| {
        config.quic.enabled = false;
        config.shutdown.drain_timeout = ConfigDuration::secs(20);
    })
    .await;
    let mut worker = RawGrpcWorker::open(&gateway)
        .await
        .expect("worker call opens");
    worker.register(raw_registration(NS, ACTIVITY, 1)).await;
    let mut client = gateway.client(None).await;

    // A task the worker holds keeps the gateway in its grace until the worker answers.
    let held = {
        let mut client = client.clone();
        tokio::spawn(async move { client.dispatch(request(b"held")).await })
    };
    let task = loop {
        match tokio::time::timeout(PATIENCE, worker.next_frame()).await {
            Ok(Ok(Some(pb::gateway_frame::Frame::Task(task)))) => break task,
            Ok(Ok(Some(_))) => {}
            other => panic!("expected the task, got {other:?}"),
        }
    };
    let addr = gateway.gateway().addr("grpc").expect("grpc listens");
    let ca_pem = gateway.ca_pem();
    // Health watches of the whole server ("", what a default probe asks) and of the API:
    // serving until the grace begins (the control), not serving from then on.
    let mut health = health_watches(addr, &ca_pem).await;
    for (service, watch) in &mut health {
        assert_eq!(
            next_status(watch).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let shutdown = tokio::spawn(async move {
        gateway.shutdown().await;
        gateway
    });
    // The worker is told the gateway is stopping: the grace has begun.
    loop {
        match tokio::time::timeout(PATIENCE, worker.next_frame()).await {
            Ok(Ok(Some(pb::gateway_frame::Frame::Drain(_)))) => break,
            Ok(Ok(Some(_))) => {}
            other => panic!("expected the shutdown notice, got {other:?}"),
        }
    }

    for (service, watch) in &mut health {
        assert_eq!(
            next_status(watch).await,
            ServingStatus::NotServing,
            "{service:?} during the grace"
        );
    }

    // A dispatch on the producer's existing connection gets the documented outcome.
    let during = tokio::time::timeout(PATIENCE, client.dispatch(request(b"late")))
        .await
        .expect("answered during the grace")
        .expect("an OK reply, not a transport error");
    assert!(
        matches!(outcome(during.into_inner()), Outcome::ShuttingDown(_)),
        "a dispatch during the grace ends shutting_down"
    );
    // So does one from a producer connecting during the grace.
    let mut fresh = api_client_at(addr, &ca_pem, None)
        .await
        .expect("the listener still accepts producers during the grace");
    let fresh_reply = tokio::time::timeout(PATIENCE, fresh.dispatch(request(b"fresh")))
        .await
        .expect("answered during the grace")
        .expect("an OK reply, not a transport error");
    assert!(matches!(
        outcome(fresh_reply.into_inner()),
        Outcome::ShuttingDown(_)
    ));
    // A worker registering now is told to come back later.
    let mut newcomer = RawGrpcWorker::open_at(addr, &ca_pem)
        .await
        .expect("the worker call opens");
    let refused = tokio::time::timeout(
        PATIENCE,
        newcomer.try_register(raw_registration(NS, ACTIVITY, 1)),
    )
    .await
    .expect("answered during the grace")
    .expect_err("no worker is admitted during the shutdown");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("shutting down"),
        "{}",
        refused.message()
    );

    // The held task finishes within the grace; its producer gets its result.
    worker.send(success(task.task_id, b"done")).await;
    let held = tokio::time::timeout(PATIENCE, held)
        .await
        .expect("the held dispatch ends")
        .expect("joined")
        .expect("an OK reply");
    assert!(matches!(outcome(held.into_inner()), Outcome::Completed(_)));

    let _gateway = tokio::time::timeout(PATIENCE, shutdown)
        .await
        .expect("the shutdown completes once nothing is held")
        .expect("joined");
    // After the listener closed, the producer's transport reports UNAVAILABLE.
    let after = tokio::time::timeout(PATIENCE, client.dispatch(request(b"after")))
        .await
        .expect("answered after the close")
        .expect_err("no gateway to answer");
    assert_eq!(after.code(), Code::Unavailable, "{after:?}");
}
