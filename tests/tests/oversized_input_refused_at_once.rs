//! An input no worker leg can carry is refused at once with `RESOURCE_EXHAUSTED` naming the
//! limit, on every producer path, and costs no worker its session; an input at the limit is
//! delivered over both transports and completes.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use switchyard_tests::{
    ApiClient, TestGateway, WorkerSpec, grpc_worker, quic_worker, wait_eligible,
};
use tonic::Code;

const NS: &str = "big";
const ACTIVITY: &str = "work";
/// Far longer than any refusal takes: a refusal that waited for it would fail the bound below.
const DISPATCH_TIMEOUT_MS: u64 = 60_000;
/// The bound every refusal must come within; well under the dispatch timeout.
const AT_ONCE: Duration = Duration::from_secs(10);

fn request(input: usize) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: NS.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        input: Bytes::from(vec![0x5a; input]),
        timeout_ms: DISPATCH_TIMEOUT_MS,
        ..pb::DispatchRequest::default()
    }
}

async fn unary(client: &mut ApiClient, input: usize) -> Result<pb::DispatchReply, tonic::Status> {
    tokio::time::timeout(AT_ONCE, client.dispatch(request(input)))
        .await
        .expect("answered well before the dispatch timeout")
        .map(tonic::Response::into_inner)
}

fn assert_names_limit(status: &tonic::Status, limit: usize) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains(&format!("{limit} bytes")),
        "the refusal states the limit {limit}: {}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_input_is_refused_at_once_and_no_worker_leaves() {
    let gateway = TestGateway::start(|_| {}).await;
    let spec = WorkerSpec {
        capacity: 1,
        ..WorkerSpec::new(NS, ACTIVITY)
    };
    let grpc = grpc_worker(&gateway, &spec).await.expect("gRPC worker");
    let quic = quic_worker(&gateway, &spec).await.expect("QUIC worker");
    wait_eligible(&gateway, NS, ACTIVITY, 2).await;
    let registry = gateway.gateway().core().registry();
    let limit = gateway.gateway().core().dispatcher().max_input_bytes();
    assert!(
        limit > 4 * 1024 * 1024 - 1024 && limit < 4 * 1024 * 1024,
        "the default 4 MiB legs leave room for the task framing only: {limit}"
    );
    let mut client = gateway.client(None).await;

    // One byte over the limit: refused by the dispatcher's own check.
    let status = unary(&mut client, limit + 1).await.expect_err("refused");
    assert_names_limit(&status, limit);
    // Above the producer API's decode limit: refused by the same status, same limit.
    let status = unary(&mut client, 6 * 1024 * 1024)
        .await
        .expect_err("refused");
    assert_names_limit(&status, limit);

    // The stream path: the same refusal on the request's reply.
    let items = futures::stream::iter([pb::DispatchStreamRequest {
        correlation_id: 7,
        request: Some(request(limit + 1)),
    }]);
    let mut replies = client
        .dispatch_stream(items)
        .await
        .expect("stream opens")
        .into_inner();
    let reply = tokio::time::timeout(AT_ONCE, replies.next())
        .await
        .expect("answered at once")
        .expect("a reply")
        .expect("the stream stays up");
    match reply.result {
        Some(StreamResult::Refused(refusal)) => {
            assert_eq!(reply.correlation_id, 7);
            assert_eq!(refusal.code, Code::ResourceExhausted as i32);
            assert!(
                refusal.message.contains(&format!("{limit} bytes")),
                "{}",
                refusal.message
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A stream item above the decode limit ends the stream with the same status.
    let items = futures::stream::iter([pb::DispatchStreamRequest {
        correlation_id: 8,
        request: Some(request(6 * 1024 * 1024)),
    }])
    .chain(futures::stream::pending());
    let mut replies = client
        .dispatch_stream(items)
        .await
        .expect("stream opens")
        .into_inner();
    let ended = tokio::time::timeout(AT_ONCE, replies.next())
        .await
        .expect("answered at once")
        .expect("the stream ends with a status");
    assert_names_limit(&ended.expect_err("refused"), limit);

    // No worker left or was excluded.
    assert!(registry.is_registered(grpc.id) && registry.is_registered(quic.id));
    let census = registry.pool_census(NS, "", ACTIVITY, None);
    assert_eq!((census.compatible, census.eligible), (2, 2), "{census:?}");
    assert_eq!((grpc.served(), quic.served()), (0, 0));

    // Control: an input exactly at the limit reaches a worker on each transport (round robin
    // over two idle workers) and completes.
    let mut ran_on = Vec::new();
    for _ in 0..2 {
        let reply = unary(&mut client, limit).await.expect("dispatched");
        match reply.outcome.and_then(|o| o.outcome) {
            Some(Outcome::Completed(done)) => ran_on.push(done.output),
            other => panic!("an input at the limit ended {other:?}"),
        }
    }
    ran_on.sort();
    assert_eq!(
        ran_on,
        [Bytes::from_static(b"grpc"), Bytes::from_static(b"quic")]
    );
    assert_eq!((grpc.served(), quic.served()), (1, 1));
    assert!(registry.is_registered(grpc.id) && registry.is_registered(quic.id));
}
