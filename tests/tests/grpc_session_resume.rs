//! gRPC worker sessions over real sockets: a worker whose link blacks out (every socket closed,
//! new ones refused) resumes within `grpc.reconnect_grace` and keeps its task; a wrong secret
//! is refused by name; the grace expiring dispatches the task again; a dispatch whose deadline
//! passes during the suspension ends `TimedOut` and its late result is refused; a resume while
//! the old stream is still up closes the old one ABORTED.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity, WorkerId};
use switchyard_gateway::ConfigDuration;
use switchyard_proto::v1 as pb;
use switchyard_tests::{RawGrpcWorker, TcpRelay, TestGateway, raw_registration, wait_eligible};
use switchyard_transport_grpc::{ActivityContext, GrpcWorker, WorkerHandle};
use tonic::Code;

const NAMESPACE: &str = "resume";
const ACTIVITY: &str = "work";

/// An SDK worker whose handler takes `work`, counts its runs and answers with `name`.
struct Worker {
    id: WorkerId,
    runs: Arc<AtomicU64>,
    started: Arc<tokio::sync::Notify>,
    handle: WorkerHandle,
}

impl Worker {
    fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

async fn worker(gateway: &TestGateway, port: u16, name: &'static str, work: Duration) -> Worker {
    let runs = Arc::new(AtomicU64::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(gateway.ca_pem()));
    let (counter, signal) = (Arc::clone(&runs), Arc::clone(&started));
    let worker = GrpcWorker::builder(format!("https://127.0.0.1:{port}"))
        .namespaces([NAMESPACE])
        .max_concurrency(2)
        .tls(tls)
        .backoff(switchyard_transport_grpc::Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        })
        .activity(ACTIVITY, move |_: ActivityContext, _: Bytes| {
            let (counter, signal) = (Arc::clone(&counter), Arc::clone(&signal));
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                signal.notify_one();
                // Deliberately deaf to cancels: the task runs its full time.
                tokio::time::sleep(work).await;
                Ok(Bytes::from_static(name.as_bytes()))
            }
        })
        .connect()
        .await
        .expect("worker registers");
    let (id, handle) = (worker.worker_id(), worker.handle());
    tokio::spawn(worker.run());
    Worker {
        id,
        runs,
        started,
        handle,
    }
}

fn request(timeout: Duration) -> ActivityRequest {
    ActivityRequest {
        namespace: NAMESPACE.into(),
        task_queue: String::new(),
        activity_type: ACTIVITY.into(),
        node: None,
        input: Bytes::from_static(b"in"),
        activity_id: None,
        timeout,
    }
}

/// One worker behind a relay, a task that takes it `work`, a dispatch waiting `timeout`, and a
/// `blackout` of the link once the worker has started the task.
struct ThroughBlackout {
    gateway: TestGateway,
    first: Worker,
    outcome: ActivityOutcome,
    _relay: TcpRelay,
}

async fn through_blackout(
    work: Duration,
    timeout: Duration,
    blackout: Duration,
) -> ThroughBlackout {
    let gateway = TestGateway::start(|_| {}).await;
    let grpc = gateway.gateway().addr("grpc").expect("grpc listens");
    let relay = TcpRelay::start(grpc).await.expect("relay");
    let first = worker(&gateway, relay.port(), "first", work).await;
    wait_eligible(&gateway, NAMESPACE, ACTIVITY, 1).await;
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    let started = first.started.notified();
    let dispatch = tokio::spawn(async move {
        dispatcher
            .dispatch(&CallerIdentity::trusted("producer"), request(timeout))
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the worker starts the task");
    relay.blackout(blackout);
    let outcome = tokio::time::timeout(Duration::from_secs(20), dispatch)
        .await
        .expect("the dispatch ends")
        .expect("dispatch task")
        .expect("dispatch accepted");
    ThroughBlackout {
        gateway,
        first,
        outcome,
        _relay: relay,
    }
}

/// What one blip scenario came to.
struct Blip {
    outcome: ActivityOutcome,
    first_runs: u64,
    second_runs: u64,
    first_id_after: Option<WorkerId>,
    first_id: WorkerId,
}

/// A worker behind a relay starts a task of `work`; a second worker joins; the relay blacks
/// out for `blackout`. Returns the outcome and who ran what.
async fn blip(grace: Duration, work: Duration, blackout: Duration) -> Blip {
    let gateway = TestGateway::start(|config| {
        config.grpc.reconnect_grace = ConfigDuration(grace);
    })
    .await;
    let grpc = gateway.gateway().addr("grpc").expect("grpc listens");
    let relay = TcpRelay::start(grpc).await.expect("relay");
    let first = worker(&gateway, relay.port(), "first", work).await;
    wait_eligible(&gateway, NAMESPACE, ACTIVITY, 1).await;
    let dispatcher = gateway.gateway().core().dispatcher().clone();
    let started = first.started.notified();
    let dispatch = tokio::spawn(async move {
        dispatcher
            .dispatch(
                &CallerIdentity::trusted("producer"),
                request(Duration::from_secs(30)),
            )
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the first worker starts the task");
    let second = worker(&gateway, grpc.port(), "second", work).await;
    wait_eligible(&gateway, NAMESPACE, ACTIVITY, 2).await;
    relay.blackout(blackout);
    let outcome = tokio::time::timeout(Duration::from_secs(30), dispatch)
        .await
        .expect("the dispatch ends")
        .expect("dispatch task")
        .expect("dispatch accepted");
    let first_id_after = first.handle.worker_id();
    Blip {
        outcome,
        first_runs: first.runs(),
        second_runs: second.runs(),
        first_id_after,
        first_id: first.id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_blip_within_the_grace_keeps_the_task_on_its_worker() {
    let kept = blip(
        Duration::from_secs(5),
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(
        kept.outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"first"))
    );
    assert_eq!(
        (kept.first_runs, kept.second_runs),
        (1, 0),
        "ran once, on its worker"
    );
    assert_eq!(
        kept.first_id_after,
        Some(kept.first_id),
        "resumed under the same id"
    );

    // Control: without a grace the same blip loses the worker and the task runs again.
    let lost = blip(
        Duration::ZERO,
        Duration::from_secs(2),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(
        lost.outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"second"))
    );
    assert_eq!(lost.second_runs, 1, "re-dispatched to the other worker");
    assert_ne!(
        lost.first_id_after,
        Some(lost.first_id),
        "registered afresh"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_computed_during_the_blackout_is_delivered_once_after_the_resume() {
    // The handler finishes 300 ms into a 1.5 s blackout.
    let run = through_blackout(
        Duration::from_millis(300),
        Duration::from_secs(30),
        Duration::from_millis(1500),
    )
    .await;
    let (first, core) = (&run.first, run.gateway.gateway().core());
    assert_eq!(
        run.outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"first"))
    );
    assert_eq!(first.runs(), 1);
    assert_eq!(
        first.handle.worker_id(),
        Some(first.id),
        "resumed, not re-registered"
    );
    // Exactly once: no copy of the result was refused as unknown, foreign or late.
    let refused = core.dispatcher().refused();
    assert_eq!((refused.unknown, refused.foreign, refused.late), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_grace_the_task_is_dispatched_again() {
    let expired = blip(
        Duration::from_millis(500),
        Duration::from_secs(2),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(
        expired.outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"second"))
    );
    assert_eq!(
        expired.second_runs, 1,
        "the other worker ran it after the grace"
    );
    assert_ne!(
        expired.first_id_after,
        Some(expired.first_id),
        "control: the first worker came back under a new registration"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_during_the_suspension_times_out_and_the_late_result_is_refused() {
    let run = through_blackout(
        Duration::from_millis(1200),
        Duration::from_secs(1),
        Duration::from_millis(2500),
    )
    .await;
    let (first, core) = (&run.first, run.gateway.gateway().core());
    assert_eq!(run.outcome, ActivityOutcome::TimedOut);
    // The result finished during the blackout reaches the gateway after the resume.
    let late = tokio::time::timeout(Duration::from_secs(20), async {
        while core.dispatcher().refused().late == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(late.is_ok(), "the late result is refused as late");
    assert_eq!(
        core.dispatcher().refused().unknown,
        0,
        "control: not as unknown"
    );
    assert_eq!(
        first.handle.worker_id(),
        Some(first.id),
        "the session resumed"
    );
}

fn resumable(namespace: &str) -> pb::WorkerFrame {
    let mut frame = raw_registration(namespace, ACTIVITY, 1);
    if let Some(pb::worker_frame::Frame::Register(register)) = frame.frame.as_mut() {
        register.resumable = true;
    }
    frame
}

fn resume(ack: &pb::RegisterAck, secret: Bytes) -> pb::WorkerFrame {
    pb::WorkerFrame {
        frame: Some(pb::worker_frame::Frame::Resume(pb::ResumeWorker {
            session_id: ack.session_id,
            resume_secret: secret,
            running_task_ids: Vec::new(),
            unacked_task_ids: Vec::new(),
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_by_name_and_a_resume_supersedes_the_old_stream() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut old = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let ack = old
        .try_register(resumable(NAMESPACE))
        .await
        .expect("registered");
    assert_eq!(ack.session_id, ack.worker_id, "a session was granted");
    assert_eq!(ack.resume_secret.len(), 32);
    assert_eq!(ack.reconnect_grace_ms, 5000);

    let mut wrong = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let mut secret = ack.resume_secret.to_vec();
    secret[0] ^= 1;
    let refused = wrong
        .try_register(resume(&ack, Bytes::from(secret)))
        .await
        .expect_err("a wrong secret is refused");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused
            .message()
            .starts_with("resume refused: wrong_secret"),
        "{}",
        refused.message()
    );

    // Control: the right secret resumes, while the old stream is still up.
    let mut new = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let resumed = new
        .try_register(resume(&ack, ack.resume_secret.clone()))
        .await
        .expect("the right secret resumes");
    assert!(resumed.resumed);
    assert_eq!(resumed.worker_id, ack.worker_id);
    match old.end(Duration::from_secs(10)).await {
        switchyard_tests::RawEnd::Status(status) => {
            assert_eq!(status.code(), Code::Aborted);
            assert_eq!(status.message(), "superseded by a resumed connection");
        }
        other => panic!("the old stream ends: {other:?}"),
    }
    // The new stream serves: it answers pings and the worker is eligible again.
    tokio::spawn(async move { new.end(Duration::from_secs(60)).await });
    wait_eligible(&gateway, NAMESPACE, ACTIVITY, 1).await;
    let worker = gateway
        .gateway()
        .core()
        .registry()
        .worker(WorkerId::from_raw(ack.worker_id));
    assert!(worker.is_some_and(|w| w.suspended_for.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_are_acknowledged_in_batches_only_to_a_session_worker() {
    let gateway = TestGateway::start(|_| {}).await;
    let mut session = RawGrpcWorker::open(&gateway).await.expect("call opens");
    session
        .try_register(resumable(NAMESPACE))
        .await
        .expect("registered");
    // Results for tasks the worker never held are refused, and still acknowledged.
    for task in 1..=100 {
        session.send(switchyard_tests::success(task, b"x")).await;
    }
    let mut batches = Vec::new();
    while batches.iter().map(Vec::len).sum::<usize>() < 100 {
        match tokio::time::timeout(Duration::from_secs(10), session.next_frame()).await {
            Ok(Ok(Some(pb::gateway_frame::Frame::ResultsAck(ack)))) => batches.push(ack.task_ids),
            Ok(Ok(Some(_))) => {}
            other => panic!("expected results acknowledgements, got {other:?}"),
        }
    }
    assert!(
        batches.len() < 100,
        "batched, not one frame per result: {batches:?}"
    );
    assert!(batches.iter().all(|batch| batch.len() <= 256));
    let acked: Vec<u64> = batches.concat();
    assert_eq!(acked, (1..=100).collect::<Vec<_>>());

    // Control: a worker without a session gets no acknowledgement.
    let mut plain = RawGrpcWorker::open(&gateway).await.expect("call opens");
    let ack = plain
        .try_register(raw_registration(NAMESPACE, ACTIVITY, 1))
        .await
        .expect("registered");
    assert_eq!(ack.session_id, 0, "no session without resumable");
    plain.send(switchyard_tests::success(1, b"x")).await;
    let next = tokio::time::timeout(Duration::from_millis(500), plain.next_frame()).await;
    assert!(
        !matches!(next, Ok(Ok(Some(pb::gateway_frame::Frame::ResultsAck(_))))),
        "{next:?}"
    );
}
