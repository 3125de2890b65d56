//! A producer that stops reading its `DispatchStream` replies is slowed (the gateway stops
//! reading its requests once `dispatch.max_stream_outstanding` are outstanding), then ended as
//! a slow consumer after `dispatch.slow_consumer_timeout`: RESOURCE_EXHAUSTED naming the key,
//! the stream's running dispatch cancelled on its worker, the refusal counted on `/metrics`. A
//! producer that keeps reading under the same limits is never ended, and its running dispatch
//! is not cancelled.
// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{CallerIdentity, CancelReason, TaskId, WorkerMessage};
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use switchyard_test_support::within;
use switchyard_tests::{
    ApiClient, ScriptedTransport, ScriptedWorker, TestGateway, counter, registration,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const NAMESPACE: &str = "stream";
/// Requests sent; their echoed replies (64 KiB each, 12.5 MiB in all) far exceed what HTTP/2
/// buffers towards a producer that does not read (its 2 MiB stream window).
const REQUESTS: u64 = 200;
const PAYLOAD: usize = 64 * 1024;
const SLOW_CONSUMER_TIMEOUT: Duration = Duration::from_millis(500);
/// The first byte of the one request the worker keeps running (the first sent); the others
/// start with [`ECHO`] and are answered with their input at once.
const HOLD: u8 = 1;
const ECHO: u8 = 7;

/// What the worker saw of the task it keeps running.
#[derive(Debug, PartialEq)]
enum Held {
    Started(TaskId),
    Cancelled(TaskId, CancelReason),
}

/// A worker serving `worker` until the gateway lets go of it: it answers pings, echoes every
/// task but the held one, reports the held task's start and any cancel, and completes the held
/// task when `release` fires.
fn serve(
    mut worker: ScriptedWorker,
    release: oneshot::Receiver<()>,
) -> (mpsc::Receiver<Held>, tokio::task::JoinHandle<()>) {
    let (seen, held) = mpsc::channel(8);
    let handle = tokio::spawn(async move {
        let mut release = Some(release);
        let mut holding: Option<TaskId> = None;
        loop {
            let released = async {
                match release.as_mut() {
                    Some(release) => release.await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                message = worker.next() => message,
                ok = released => {
                    release = None;
                    if let (true, Some(task)) = (ok, holding.take()) {
                        worker.complete(task, Bytes::from_static(&[HOLD]));
                    }
                    continue;
                }
            };
            match message {
                None => return,
                Some(WorkerMessage::Ping { seq }) => worker.pong(seq),
                Some(WorkerMessage::Task(task)) if task.input.first() == Some(&HOLD) => {
                    holding = Some(task.task_id);
                    let _ = seen.send(Held::Started(task.task_id)).await;
                }
                Some(WorkerMessage::Task(task)) => worker.complete(task.task_id, task.input),
                Some(WorkerMessage::Cancel { task_id, reason }) => {
                    let _ = seen.send(Held::Cancelled(task_id, reason)).await;
                }
                Some(_) => {}
            }
        }
    });
    (held, handle)
}

/// A gateway with one worker (see [`serve`]), at most 4 outstanding per stream and a 500 ms
/// slow-consumer timeout, and a `DispatchStream` already sent [`REQUESTS`] requests, the first
/// of them the one the worker holds (already started when this returns).
struct Setup {
    gateway: TestGateway,
    replies: tonic::Streaming<pb::DispatchStreamReply>,
    held: mpsc::Receiver<Held>,
    held_task: TaskId,
    release: oneshot::Sender<()>,
    _serving: tokio::task::JoinHandle<()>,
    /// The request side stays open: the stream ends by the gateway's doing, or not at all.
    _requests: mpsc::Sender<pb::DispatchStreamRequest>,
}

async fn stream_with_requests() -> Setup {
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
    let (release, released) = oneshot::channel();
    let (mut held, serving) = serve(worker, released);
    let mut client: ApiClient = gateway.client(None).await;
    let (send, outbound) = mpsc::channel(REQUESTS as usize);
    for correlation_id in 0..REQUESTS {
        let first = if correlation_id == 0 { HOLD } else { ECHO };
        let mut input = vec![ECHO; PAYLOAD];
        input[0] = first;
        send.send(pb::DispatchStreamRequest {
            correlation_id,
            request: Some(pb::DispatchRequest {
                namespace: NAMESPACE.to_owned(),
                activity_type: "echo".to_owned(),
                input: Bytes::from(input),
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
    let held_task = match within("the held task's start", held.recv()).await {
        Some(Held::Started(task)) => task,
        other => panic!("expected the held task to start: {other:?}"),
    };
    Setup {
        gateway,
        replies,
        held,
        held_task,
        release,
        _serving: serving,
        _requests: send,
    }
}

/// `switchyard_limit_refusals_total{limit="dispatch.slow_consumer_timeout"}` on `/metrics`.
async fn slow_consumer_refusals(gateway: &TestGateway) -> u64 {
    let ops = gateway.gateway().ops_addr().expect("an ops listener");
    counter(
        ops,
        "switchyard_limit_refusals_total",
        "limit=\"dispatch.slow_consumer_timeout\"",
    )
    .await
    .expect("/metrics")
}

/// Reads `replies` until `expected` outcomes or the stream's end: the number of outcomes, and
/// the status the stream ended with (`None` for a clean end or `expected` reached).
async fn read_outcomes(
    replies: &mut tonic::Streaming<pb::DispatchStreamReply>,
    expected: u64,
) -> (u64, Option<tonic::Status>) {
    let mut outcomes = 0;
    loop {
        if outcomes == expected {
            return (outcomes, None);
        }
        match replies.message().await {
            Ok(Some(pb::DispatchStreamReply {
                result: Some(StreamResult::Outcome(_)),
                ..
            })) => outcomes += 1,
            Ok(Some(other)) => panic!("unexpected reply {other:?}"),
            Ok(None) => return (outcomes, None),
            Err(status) => return (outcomes, Some(status)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_replies_are_never_read_is_ended_as_a_slow_consumer() {
    let mut setup = stream_with_requests().await;
    // Nothing is read: the gateway ends the stream, which cancels the dispatch still running.
    let cancelled = within("the held task's cancel", setup.held.recv()).await;
    assert_eq!(
        cancelled,
        Some(Held::Cancelled(setup.held_task, CancelReason::CallerGone)),
        "the ended stream's running dispatch is cancelled on its worker"
    );
    let (outcomes, ended) = within(
        "the stream's end",
        read_outcomes(&mut setup.replies, REQUESTS),
    )
    .await;
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
        outcomes < REQUESTS - 1,
        "the gateway stopped reading the producer: {outcomes} of {REQUESTS} answered"
    );
    assert_eq!(slow_consumer_refusals(&setup.gateway).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_replies_are_read_is_never_ended() {
    // Control: the same limits, load and held task, every reply read as it comes.
    let mut setup = stream_with_requests().await;
    let (outcomes, ended) = within(
        "every echoed reply",
        read_outcomes(&mut setup.replies, REQUESTS - 1),
    )
    .await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(outcomes, REQUESTS - 1);
    assert!(
        setup.held.try_recv().is_err(),
        "the held task of a stream being read was cancelled"
    );
    // The held task, completed now, still reaches the producer on the same stream.
    setup.release.send(()).expect("the worker is serving");
    let (last, ended) = within("the held reply", read_outcomes(&mut setup.replies, 1)).await;
    assert!(ended.is_none(), "{ended:?}");
    assert_eq!(last, 1);
    assert_eq!(slow_consumer_refusals(&setup.gateway).await, 0);
}
