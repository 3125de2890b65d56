//! The producer API's flow control and operator actions: a `DispatchStream` runs at most its
//! in-flight bound, `Cancel` ends a dispatch and tells its worker, and `Drain` with a deadline
//! cancels what a worker that does not finish still holds, reporting `done` once it has left.

// Helpers outside the #[test] functions fail the test on a failed step, like the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{CallerIdentity, CancelReason, WorkerMessage};
use switchyard_proto::v1 as pb;
use switchyard_proto::v1::dispatch_outcome::Outcome;
use switchyard_proto::v1::dispatch_stream_reply::Result as StreamResult;
use switchyard_tests::{ScriptedTransport, TestGateway, registration};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_stream::wrappers::ReceiverStream;

const WAIT: Duration = Duration::from_secs(10);

fn request(namespace: &str, activity_id: &str) -> pb::DispatchRequest {
    pb::DispatchRequest {
        namespace: namespace.to_owned(),
        activity_type: "echo".to_owned(),
        input: Bytes::from_static(b"x"),
        activity_id: activity_id.to_owned(),
        timeout_ms: 30_000,
        ..pb::DispatchRequest::default()
    }
}

async fn started(
    scripted: &ScriptedTransport,
    namespace: &str,
    capacity: u32,
) -> (
    switchyard_tests::WorkerControl,
    mpsc::Receiver<switchyard_core::ActivityTask>,
    tokio::task::JoinHandle<()>,
) {
    scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&[namespace], &["echo"], Some(capacity)),
            true,
        )
        .await
        .expect("admitted")
        .answer_pings_in_background()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_stream_runs_at_most_its_in_flight_bound() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| {
            config.quic.enabled = false;
            config.dispatch.max_in_flight_per_stream = 2;
        },
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let (worker, mut tasks, _keep) = started(&scripted, "bounded", 10).await;
    let mut client = gateway.client(None).await;
    let (send, outbound) = mpsc::channel(16);
    for id in 0..5 {
        send.send(pb::DispatchStreamRequest {
            correlation_id: id,
            request: Some(request("bounded", "")),
        })
        .await
        .unwrap();
    }
    let mut replies = client
        .dispatch_stream(ReceiverStream::new(outbound))
        .await
        .expect("stream opens")
        .into_inner();

    let first = timeout(WAIT, tasks.recv()).await.unwrap().unwrap();
    let _second = timeout(WAIT, tasks.recv()).await.unwrap().unwrap();
    // The worker has room for ten; the stream's bound keeps the third request unread.
    assert!(
        timeout(Duration::from_millis(300), tasks.recv())
            .await
            .is_err(),
        "a third dispatch ran beyond the bound of 2"
    );
    assert_eq!(gateway.gateway().core().dispatcher().pending_tasks(), 2);

    worker.complete(first.task_id, Bytes::from_static(b"done"));
    let reply = timeout(WAIT, replies.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(
        reply.result,
        Some(StreamResult::Outcome(pb::DispatchOutcome {
            outcome: Some(Outcome::Completed(_))
        }))
    ));
    // Control: one finished, so exactly one more is read and dispatched.
    timeout(WAIT, tasks.recv())
        .await
        .expect("a third dispatch after one ended")
        .unwrap();
    assert!(
        timeout(Duration::from_millis(300), tasks.recv())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_the_dispatch_and_tells_the_worker() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let mut worker = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["cancel"], &["echo"], Some(1)),
            true,
        )
        .await
        .unwrap();
    let mut client = gateway.client(None).await;
    let mut producer = client.clone();
    let dispatch = tokio::spawn(async move { producer.dispatch(request("cancel", "job-1")).await });
    let task = timeout(WAIT, async {
        loop {
            match worker.next().await {
                Some(WorkerMessage::Ping { seq }) => worker.pong(seq),
                Some(WorkerMessage::Task(task)) => return task,
                Some(_) => {}
                None => panic!("disconnected"),
            }
        }
    })
    .await
    .expect("the task arrives");

    let missing = client
        .cancel(pb::CancelDispatchRequest {
            namespace: "cancel".to_owned(),
            activity_id: "job-2".to_owned(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    client
        .cancel(pb::CancelDispatchRequest {
            namespace: "cancel".to_owned(),
            activity_id: "job-1".to_owned(),
            ..pb::CancelDispatchRequest::default()
        })
        .await
        .expect("cancelled");
    let reply = dispatch
        .await
        .unwrap()
        .expect("dispatch answered")
        .into_inner();
    assert!(matches!(
        reply.outcome.and_then(|o| o.outcome),
        Some(Outcome::Cancelled(_))
    ));
    let cancel = timeout(WAIT, async {
        loop {
            match worker.next().await {
                Some(WorkerMessage::Cancel { task_id, .. }) => return task_id,
                Some(WorkerMessage::Ping { seq }) => worker.pong(seq),
                Some(_) => {}
                None => panic!("disconnected"),
            }
        }
    })
    .await
    .expect("the worker is told");
    assert_eq!(cancel, task.task_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_deadline_cancels_what_the_worker_holds_and_done_waits_for_its_departure() {
    let scripted = ScriptedTransport::default();
    let gateway = TestGateway::start_with(
        |config| config.quic.enabled = false,
        |builder| builder.transport(scripted.clone()),
    )
    .await;
    let core = gateway.gateway().core().clone();
    // The stubborn worker holds its task and ignores the drain request.
    let mut stubborn = scripted
        .connect(
            &CallerIdentity::trusted("test"),
            registration(&["drain"], &["echo"], Some(1)),
            true,
        )
        .await
        .expect("admitted");
    let id = stubborn.id();
    let mut client = gateway.client(None).await;
    let mut producer = client.clone();
    let dispatch = tokio::spawn(async move { producer.dispatch(request("drain", "")).await });
    let task = next_matching(&mut stubborn, |m| match m {
        WorkerMessage::Task(task) => Some(task),
        _ => None,
    })
    .await;

    let mut progress = client
        .drain(pb::DrainWorkersRequest {
            target: Some(pb::drain_workers_request::Target::WorkerId(id.get())),
            deadline_ms: 300,
        })
        .await
        .expect("drain accepted")
        .into_inner();
    let first = progress.message().await.unwrap().unwrap();
    assert_eq!(first.tasks_remaining, 1);
    assert_eq!(
        first.cancelled_at_deadline, 0,
        "nothing cancelled before the deadline"
    );
    assert!(!first.done);

    // At the deadline the worker is sent a cancel naming the drain deadline.
    let reason = next_matching(&mut stubborn, |m| match m {
        WorkerMessage::Cancel { task_id, reason } if task_id == task.task_id => Some(reason),
        _ => None,
    })
    .await;
    assert_eq!(reason, CancelReason::DrainDeadline);
    let reply = dispatch
        .await
        .unwrap()
        .expect("dispatch answered")
        .into_inner();
    assert!(
        matches!(
            reply.outcome.and_then(|o| o.outcome),
            Some(Outcome::Cancelled(_))
        ),
        "the held dispatch ends cancelled"
    );
    // The progress after the deadline reports the cancel, and is not done: the worker is
    // still registered, fenced, holding the slot until it lets go.
    let after = timeout(WAIT, async {
        loop {
            let step = progress.message().await.unwrap().expect("progress");
            if step.cancelled_at_deadline > 0 || step.done {
                return step;
            }
        }
    })
    .await
    .expect("the deadline is reported");
    assert_eq!(after.cancelled_at_deadline, 1);
    assert!(
        !after.done,
        "not done while the worker is registered: {after:?}"
    );
    assert_eq!(after.tasks_remaining, 1);
    assert_eq!(after.workers.len(), 1);
    let snapshot = core.registry().worker(id).expect("still registered");
    assert_eq!(snapshot.eligibility, switchyard_core::Eligibility::Draining);
    assert_eq!(snapshot.in_flight, 1);

    // Control: once the worker lets go and leaves, the last message is done.
    core.cancel_acknowledged(id, task.task_id)
        .expect("the cancel was pending");
    drop(stubborn);
    let last = timeout(WAIT, async {
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
    .expect("the drain ends once the worker left");
    assert!(last.workers.is_empty());
    assert_eq!((last.workers_left, last.tasks_remaining), (1, 0));
    assert_eq!(
        last.cancelled_at_deadline, 1,
        "the count stays on the last message"
    );
    assert!(
        progress.message().await.unwrap().is_none(),
        "nothing after done"
    );
}

/// Reads the worker's messages (answering pings) until `pick` accepts one.
async fn next_matching<T>(
    worker: &mut switchyard_tests::ScriptedWorker,
    pick: impl Fn(WorkerMessage) -> Option<T>,
) -> T {
    timeout(WAIT, async {
        loop {
            match worker.next().await {
                Some(WorkerMessage::Ping { seq }) => worker.pong(seq),
                Some(message) => {
                    if let Some(found) = pick(message) {
                        return found;
                    }
                }
                None => panic!("disconnected"),
            }
        }
    })
    .await
    .expect("the message arrives")
}
