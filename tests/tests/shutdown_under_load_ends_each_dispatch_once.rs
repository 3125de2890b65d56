//! A graceful shutdown (what SIGTERM triggers) under load ends every dispatch with exactly one
//! outcome: the ones workers hold finish during the drain, the ones waiting end
//! `shutting_down`, none is lost or answered twice.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use switchyard_tests::{TestGateway, WorkerSpec, grpc_worker, quic_worker, wait_eligible};

const DISPATCHES: u64 = 120;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dispatch_gets_exactly_one_outcome() {
    let mut gateway = TestGateway::start(|config| {
        config.shutdown.drain_timeout = ConfigDuration::secs(5);
    })
    .await;
    let spec = WorkerSpec {
        task_time: Duration::from_millis(50),
        capacity: 4,
        ..WorkerSpec::new("load", "work")
    };
    let grpc = grpc_worker(&gateway, &spec).await.expect("gRPC worker");
    let quic = quic_worker(&gateway, &spec).await.expect("QUIC worker");
    wait_eligible(&gateway, "load", "work", 2).await;

    let mut client = gateway.client(None).await;
    let requests = futures::stream::iter((0..DISPATCHES).map(|id| pb::DispatchStreamRequest {
        correlation_id: id,
        request: Some(pb::DispatchRequest {
            namespace: "load".to_owned(),
            activity_type: "work".to_owned(),
            input: Bytes::from_static(b"x"),
            timeout_ms: 60_000,
            ..pb::DispatchRequest::default()
        }),
    }))
    .chain(futures::stream::pending());
    let mut replies = client
        .dispatch_stream(requests)
        .await
        .expect("stream opens")
        .into_inner();

    // Shut down once the load is on: some replies are in, most dispatches wait.
    let mut outcomes: HashMap<u64, Vec<&'static str>> = HashMap::new();
    while outcomes.len() < 8 {
        let reply = replies.next().await.expect("reply").expect("ok");
        outcomes
            .entry(reply.correlation_id)
            .or_default()
            .push(label(reply.result));
    }
    let shutdown = tokio::spawn(async move {
        gateway.shutdown().await;
        gateway
    });
    let collected = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(reply) = replies.next().await {
            let Ok(reply) = reply else { break };
            outcomes
                .entry(reply.correlation_id)
                .or_default()
                .push(label(reply.result));
        }
        outcomes
    })
    .await
    .expect("the stream ends after the shutdown");
    let _gateway = shutdown.await.expect("shutdown completes");

    assert_eq!(
        collected.len() as u64,
        DISPATCHES,
        "every dispatch answered"
    );
    for (id, seen) in &collected {
        assert_eq!(seen.len(), 1, "dispatch {id} answered {seen:?}");
        assert!(
            matches!(seen[0], "completed" | "shutting_down"),
            "dispatch {id} ended {}",
            seen[0]
        );
    }
    let completed = collected.values().filter(|s| s[0] == "completed").count() as u64;
    let stopped = collected
        .values()
        .filter(|s| s[0] == "shutting_down")
        .count();
    assert!(
        completed >= 8 && stopped > 0,
        "completed {completed}, shutting_down {stopped}"
    );
    assert_eq!(
        grpc.served() + quic.served(),
        completed,
        "every completed dispatch was run once by a worker"
    );
}

fn label(result: Option<StreamResult>) -> &'static str {
    match result {
        Some(StreamResult::Outcome(pb::DispatchOutcome {
            outcome: Some(outcome),
        })) => match outcome {
            Outcome::Completed(_) => "completed",
            Outcome::Failed(_) => "failed",
            Outcome::TimedOut(_) => "timed_out",
            Outcome::Cancelled(_) => "cancelled",
            Outcome::Unserved(_) => "unserved",
            Outcome::TransportLost(_) => "transport_lost",
            Outcome::ShuttingDown(_) => "shutting_down",
            Outcome::Other(_) => "other",
        },
        Some(StreamResult::Refused(_)) => "refused",
        _ => "empty",
    }
}
