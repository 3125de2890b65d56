//! A producer that stops reading its `DispatchStream` replies is slowed (the gateway stops
//! reading its requests once `dispatch.max_stream_outstanding` are outstanding), then ended as
//! a slow consumer after `dispatch.slow_consumer_timeout`, with RESOURCE_EXHAUSTED naming the
//! key; a producer that keeps reading under the same limits is never ended.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::CallerIdentity;
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use switchyard_test_support::within;
use switchyard_tests::{ApiClient, ScriptedTransport, TestGateway, registration};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const NAMESPACE: &str = "stream";
/// Requests sent; their echoed replies (64 KiB each, 12.5 MiB in all) far exceed what HTTP/2
/// buffers towards a producer that does not read (its 2 MiB stream window).
const REQUESTS: u64 = 200;
const PAYLOAD: usize = 64 * 1024;
const SLOW_CONSUMER_TIMEOUT: Duration = Duration::from_millis(500);

/// A gateway with an echo worker, at most 4 outstanding per stream and a 500 ms slow-consumer
/// timeout, and a `DispatchStream` already sent [`REQUESTS`] requests.
async fn stream_with_requests() -> (
    TestGateway,
    tonic::Streaming<pb::DispatchStreamReply>,
    tokio::task::JoinHandle<()>,
    mpsc::Sender<pb::DispatchStreamRequest>,
) {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.dispatch.max_stream_outstanding = 4;
            config.dispatch.slow_consumer_timeout =
                ConfigDuration::millis(SLOW_CONSUMER_TIMEOUT.as_millis() as u64);
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let worker = scripted
        .connect(
            &CallerIdentity::trusted("echo"),
            registration(&[NAMESPACE], &["echo"], Some(64)),
            true,
        )
        .await
        .expect("admitted");
    let serving = worker.serve_echo();
    let mut client: ApiClient = gateway.client(None).await;
    let (send, outbound) = mpsc::channel(REQUESTS as usize);
    for correlation_id in 0..REQUESTS {
        send.send(pb::DispatchStreamRequest {
            correlation_id,
            request: Some(pb::DispatchRequest {
                namespace: NAMESPACE.to_owned(),
                activity_type: "echo".to_owned(),
                input: Bytes::from(vec![7; PAYLOAD]),
                timeout_ms: 30_000,
                ..pb::DispatchRequest::default()
            }),
        })
        .await
        .unwrap();
    }
    let replies = client
        .dispatch_stream(ReceiverStream::new(outbound))
        .await
        .expect("stream opens")
        .into_inner();
    // The request side stays open (the sender is returned): the stream ends by the gateway's
    // doing, or not at all.
    (gateway, replies, serving, send)
}

/// Reads `replies` to their end: the number of outcomes, and the status the stream ended with
/// (`None` for a clean end).
async fn read_to_end(
    replies: &mut tonic::Streaming<pb::DispatchStreamReply>,
) -> (u64, Option<tonic::Status>) {
    let mut outcomes = 0;
    loop {
        match replies.message().await {
            Ok(Some(pb::DispatchStreamReply {
                result: Some(StreamResult::Outcome(_)),
                ..
            })) => {
                outcomes += 1;
                if outcomes == REQUESTS {
                    return (outcomes, None);
                }
            }
            Ok(Some(other)) => panic!("unexpected reply {other:?}"),
            Ok(None) => return (outcomes, None),
            Err(status) => return (outcomes, Some(status)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_replies_are_never_read_is_ended_as_a_slow_consumer() {
    let (_gateway, mut replies, _serving, _requests) = stream_with_requests().await;
    // What is under test is time passing with no reply taken: nothing to wait on but the clock.
    tokio::time::sleep(SLOW_CONSUMER_TIMEOUT * 3).await;
    let (outcomes, ended) = within("the stream's end", read_to_end(&mut replies)).await;
    let status = ended.expect("the gateway ended the stream");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("`dispatch.slow_consumer_timeout` (500ms)")
            && status
                .message()
                .contains("`dispatch.max_stream_outstanding` (4)"),
        "{}",
        status.message()
    );
    assert!(
        outcomes < REQUESTS,
        "the gateway stopped reading the producer: {outcomes} of {REQUESTS} answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_replies_are_read_is_never_ended() {
    // Control: the same limits and load, read as fast as they come.
    let (_gateway, mut replies, _serving, _requests) = stream_with_requests().await;
    let (outcomes, ended) = within("every reply", read_to_end(&mut replies)).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(outcomes, REQUESTS);
}
