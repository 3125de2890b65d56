//! The Rust worker SDK against a real TLS gateway: handlers, concurrency, cancellation, drain,
//! reconnection and refusals.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, CallerIdentity, DisconnectReason, WorkerEvent, WorkerId};
use switchyard_transport_grpc::{
    ActivityContext, ActivityError, Backoff, GrpcLinkError, GrpcWorker, GrpcWorkerBuilder,
    WorkerError,
};
use tokio::sync::{Semaphore, mpsc};
use tonic::Code;

use crate::support;
use crate::support::{BILLING_TOKEN, Gateway, TRUSTED_TOKEN, dispatch, request, within};

fn sdk(gateway: &Gateway) -> GrpcWorkerBuilder {
    GrpcWorker::builder(gateway.endpoint())
        .namespaces(["ns"])
        .tls(gateway.pki.client_tls())
        .token(TRUSTED_TOKEN)
        .backoff(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        })
}

async fn echo(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
    Ok(input)
}

/// Starts `worker` running and waits until core dispatches to it.
async fn running(
    gateway: &Gateway,
    worker: GrpcWorker,
) -> (WorkerId, tokio::task::JoinHandle<Result<(), WorkerError>>) {
    let id = worker.worker_id();
    let run = tokio::spawn(worker.run());
    support::eligible(&gateway.core, id).await;
    (id, run)
}

/// A handler that reports each start on `started`, then waits for a permit of `release`.
fn gated(
    started: mpsc::UnboundedSender<()>,
    release: Arc<Semaphore>,
    live: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
) -> impl Fn(ActivityContext, Bytes) -> futures::future::BoxFuture<'static, Result<Bytes, ActivityError>>
+ Send
+ Sync
+ 'static {
    move |_, input| {
        let (started, release, live, peak) =
            (started.clone(), release.clone(), live.clone(), peak.clone());
        Box::pin(async move {
            let now = live.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            started.send(()).unwrap();
            release.acquire().await.unwrap().forget();
            live.fetch_sub(1, Ordering::SeqCst);
            Ok(input)
        })
    }
}

#[tokio::test]
async fn handlers_outputs_failures_and_panics_become_outcomes() {
    let gateway = Gateway::start().await;
    let worker = sdk(&gateway)
        .activity("echo", echo)
        .activity("fail", |_: ActivityContext, _: Bytes| async {
            Err::<Bytes, _>(ActivityError::retryable("upstream busy"))
        })
        .activity("panic", |_: ActivityContext, _: Bytes| async {
            panic!("handler bug");
            #[allow(unreachable_code)]
            Ok(Bytes::new())
        })
        .max_concurrency(4)
        .connect()
        .await
        .unwrap();
    assert_eq!(worker.task_queue(), "default");
    let (_, _run) = running(&gateway, worker).await;

    let echoed = dispatch(&gateway.core, request("ns", "echo", b"ping"));
    let failed = dispatch(&gateway.core, request("ns", "fail", b""));
    let panicked = dispatch(&gateway.core, request("ns", "panic", b""));
    assert_eq!(
        echoed.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"ping"))
    );
    assert_eq!(
        failed.await.unwrap(),
        ActivityOutcome::Failed {
            message: "upstream busy".into(),
            retryable: true
        }
    );
    assert_eq!(
        panicked.await.unwrap(),
        ActivityOutcome::Failed {
            message: "activity handler panicked: handler bug".into(),
            retryable: false
        }
    );
}

#[tokio::test]
async fn never_more_than_max_concurrency_handlers_run_at_once() {
    let gateway = Gateway::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let live = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let worker = sdk(&gateway)
        .activity(
            "gated",
            gated(started_tx, release.clone(), live.clone(), peak.clone()),
        )
        .max_concurrency(2)
        .connect()
        .await
        .unwrap();
    let (_, _run) = running(&gateway, worker).await;

    let outcomes: Vec<_> = (0..5)
        .map(|_| dispatch(&gateway.core, request("ns", "gated", b"x")))
        .collect();
    for _ in 0..5 {
        within("a handler to start", started.recv()).await.unwrap();
        assert!(live.load(Ordering::SeqCst) <= 2);
        release.add_permits(1);
    }
    for outcome in outcomes {
        assert_eq!(
            outcome.await.unwrap(),
            ActivityOutcome::Completed(Bytes::from_static(b"x"))
        );
    }
    // Control: the limit was reached, not just respected by running one at a time.
    assert_eq!(peak.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn cancel_fires_the_handler_token_and_frees_the_slot() {
    let gateway = Gateway::start().await;
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (saw_cancel_tx, mut saw_cancel) = mpsc::unbounded_channel();
    let worker = sdk(&gateway)
        .activity("wait", move |ctx: ActivityContext, _: Bytes| {
            let (started, saw_cancel) = (started_tx.clone(), saw_cancel_tx.clone());
            async move {
                started.send(()).unwrap();
                ctx.cancelled().await;
                saw_cancel.send(ctx.task_id()).unwrap();
                Err::<Bytes, _>(ActivityError::fatal("cancelled"))
            }
        })
        .activity("echo", echo)
        .max_concurrency(1)
        .connect()
        .await
        .unwrap();
    let (_, _run) = running(&gateway, worker).await;

    let mut waiting = request("ns", "wait", b"");
    waiting.activity_id = Some("a1".into());
    let outcome = dispatch(&gateway.core, waiting);
    within("the handler to start", started.recv())
        .await
        .unwrap();
    gateway
        .core
        .dispatcher()
        .cancel(&CallerIdentity::trusted("producer"), "ns", "a1")
        .unwrap();
    assert_eq!(outcome.await.unwrap(), ActivityOutcome::Cancelled);
    within("the handler to see the cancellation", saw_cancel.recv())
        .await
        .unwrap();

    // The worker's only slot comes back once its cancel acknowledgement arrives.
    let next = dispatch(&gateway.core, request("ns", "echo", b"after"));
    assert_eq!(
        next.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"after"))
    );
    assert_eq!(gateway.core.dispatcher().refused().late, 0);
}

/// Who asks for a drain in [`drain_waits_for_in_flight_work`].
enum DrainBy {
    /// An operator, through the gateway's registry.
    Gateway,
    /// The worker itself, through its handle.
    Worker,
}

/// Starts a gated task, asks for a drain, and checks that the worker leaves `Drained` only
/// after the task completed.
async fn drain_waits_for_in_flight_work(by: DrainBy) {
    let gateway = Gateway::start().await;
    let mut events = gateway.core.registry().subscribe_events();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let counters = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let worker = sdk(&gateway)
        .activity(
            "gated",
            gated(started_tx, release.clone(), counters.0, counters.1),
        )
        .max_concurrency(2)
        .connect()
        .await
        .unwrap();
    let handle = worker.handle();
    let (id, run) = running(&gateway, worker).await;

    let outcome = dispatch(&gateway.core, request("ns", "gated", b"work"));
    within("the handler to start", started.recv())
        .await
        .unwrap();
    match by {
        DrainBy::Gateway => assert!(gateway.core.registry().drain_worker(id)),
        DrainBy::Worker => handle.drain().unwrap(),
    }
    assert!(
        !run.is_finished(),
        "the worker waits for its in-flight task"
    );
    release.add_permits(1);
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"work"))
    );
    within("run to return", run).await.unwrap().unwrap();
    // Only a drain by the gateway ends a worker `Drained` (a worker that just left is
    // `Disconnect`), so this also proves the worker's request reached the gateway.
    assert_eq!(
        support::disconnected(&mut events, id).await,
        DisconnectReason::Drained
    );
}

#[tokio::test]
async fn drain_finishes_in_flight_work_then_closes() {
    drain_waits_for_in_flight_work(DrainBy::Gateway).await;
}

#[tokio::test]
async fn a_lost_stream_is_replaced_by_a_new_registration() {
    let gateway = Gateway::start().await;
    let worker = sdk(&gateway)
        .activity("echo", echo)
        .connect()
        .await
        .unwrap();
    let (first, _run) = running(&gateway, worker).await;
    let mut events = gateway.core.registry().subscribe_events();

    // Core letting the worker go ends its stream (and its session: a silence verdict would only
    // suspend it); the SDK's resume is refused, and it comes back under a new registration.
    assert!(
        gateway
            .core
            .registry()
            .deregister(first, DisconnectReason::Unresponsive)
    );
    let second = within("a new registration", async {
        loop {
            if let WorkerEvent::Connected {
                worker, transport, ..
            } = events.recv().await.unwrap()
            {
                assert_eq!(transport.as_str(), "grpc");
                return worker;
            }
        }
    })
    .await;
    assert_ne!(second, first);
    support::eligible(&gateway.core, second).await;
    let outcome = dispatch(&gateway.core, request("ns", "echo", b"back"));
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"back"))
    );
}

#[tokio::test]
async fn connect_reports_refusals_as_permanent_and_outages_as_transient() {
    let gateway = Gateway::start().await;
    let refused = sdk(&gateway)
        .namespaces(["payroll"])
        .token(BILLING_TOKEN)
        .activity("echo", echo)
        .connect()
        .await
        .unwrap_err();
    let Some(GrpcLinkError::Refused(status)) = refused.link_error::<GrpcLinkError>() else {
        panic!("expected a refusal, got {refused:?}");
    };
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(refused.is_permanent());

    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let unreachable = GrpcWorker::builder(format!("https://localhost:{port}"))
        .namespaces(["ns"])
        .tls(gateway.pki.client_tls())
        .activity("echo", echo)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            unreachable.link_error::<GrpcLinkError>(),
            Some(GrpcLinkError::Unreachable(_))
        ),
        "{unreachable:?}"
    );
    assert!(!unreachable.is_permanent());
}

/// Waits for the next `Connected` event and returns its worker.
async fn next_registration(events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>) -> WorkerId {
    within("a new registration", async {
        loop {
            if let WorkerEvent::Connected { worker, .. } = events.recv().await.unwrap() {
                return worker;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_shutting_down_gateway_sends_the_worker_back_after_its_in_flight_work() {
    let gateway = Gateway::start().await;
    let mut events = gateway.core.registry().subscribe_events();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let counters = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let worker = sdk(&gateway)
        .activity("echo", echo)
        .activity(
            "gated",
            gated(started_tx, release.clone(), counters.0, counters.1),
        )
        .connect()
        .await
        .unwrap();
    let (first, run) = running(&gateway, worker).await;
    assert_eq!(next_registration(&mut events).await, first);

    let outcome = dispatch(&gateway.core, request("ns", "gated", b"work"));
    within("the handler to start", started.recv())
        .await
        .unwrap();
    // The registry's shutdown notice, without stopping the server yet.
    assert_eq!(gateway.core.registry().broadcast_shutdown(), 1);
    release.add_permits(1);
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"work")),
        "in-flight work is finished first"
    );
    assert_eq!(
        support::disconnected(&mut events, first).await,
        DisconnectReason::Drained
    );
    assert!(!run.is_finished(), "a shutdown notice is not final");
    // The gateway comes back on the same address; the worker finds it by itself.
    let gateway = Gateway::builder().restart_of(gateway).await;
    let mut events = gateway.core.registry().subscribe_events();
    let second = match gateway.core.registry().workers().first() {
        Some(already) => already.worker.id(),
        None => next_registration(&mut events).await,
    };
    assert!(!run.is_finished(), "still serving after the restart");
    support::eligible(&gateway.core, second).await;
    let outcome = dispatch(&gateway.core, request("ns", "echo", b"back"));
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from_static(b"back"))
    );
    // Control: a requested drain is final; `run` returns.
    assert!(gateway.core.registry().drain_worker(second));
    within("run to return", run).await.unwrap().unwrap();
}

#[tokio::test]
async fn an_input_too_large_for_the_stream_is_refused_and_no_worker_leaves() {
    let limit = 64 * 1024;
    let gateway = Gateway::builder()
        .config(switchyard_transport_grpc::GrpcServerConfig {
            max_message_bytes: limit,
            ..switchyard_transport_grpc::GrpcServerConfig::default()
        })
        .start()
        .await;
    let mut events = gateway.core.registry().subscribe_events();
    let mut ids = Vec::new();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let worker = sdk(&gateway)
            .activity("echo", echo)
            .connect()
            .await
            .unwrap();
        let (id, run) = running(&gateway, worker).await;
        ids.push(id);
        runs.push(run);
    }
    let input = |len: usize| switchyard_core::ActivityRequest {
        input: Bytes::from(vec![b'x'; len]),
        ..request("ns", "echo", b"")
    };
    let producer = CallerIdentity::trusted("producer");
    // Under the stream limit but over it once framed as a task.
    let refused = gateway
        .core
        .dispatcher()
        .dispatch(&producer, input(limit - 8))
        .await;
    let Err(switchyard_core::DispatchError::InputTooLarge { size, limit: fits }) = refused else {
        panic!("expected InputTooLarge, got {refused:?}");
    };
    assert_eq!(size, limit - 8);
    assert!(fits < size && fits > limit - 256, "{fits}");
    for id in &ids {
        assert!(
            gateway.core.registry().is_registered(*id),
            "worker {id} left"
        );
    }
    assert!(!left_any(&mut events), "no worker left");
    // Control: the same input minus the framing is served.
    let served = gateway
        .core
        .dispatcher()
        .dispatch(&producer, input(fits))
        .await
        .unwrap();
    assert_eq!(
        served,
        ActivityOutcome::Completed(Bytes::from(vec![b'x'; fits]))
    );
    assert_eq!(gateway.core.registry().len(), 3);
}

/// True when a `Disconnected` event is waiting in `events`.
fn left_any(events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>) -> bool {
    while let Ok(event) = events.try_recv() {
        if matches!(event, WorkerEvent::Disconnected { .. }) {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a_result_over_the_stated_frame_limit_fails_locally_and_the_worker_stays() {
    let limit = 64 * 1024;
    let gateway = Gateway::builder()
        .config(switchyard_transport_grpc::GrpcServerConfig {
            max_message_bytes: limit,
            ..switchyard_transport_grpc::GrpcServerConfig::default()
        })
        .start()
        .await;
    async fn inflate(_: ActivityContext, input: Bytes) -> Result<Bytes, ActivityError> {
        let len: usize = std::str::from_utf8(&input).unwrap().parse().unwrap();
        Ok(Bytes::from(vec![b'y'; len]))
    }
    // The SDK's own limit is the 16 MiB default: only the acknowledgement tells it 64 KiB.
    let worker = sdk(&gateway)
        .activity("inflate", inflate)
        .connect()
        .await
        .unwrap();
    let (id, _run) = running(&gateway, worker).await;
    let outcome = dispatch(&gateway.core, request("ns", "inflate", b"200000"));
    let ActivityOutcome::Failed { message, retryable } = outcome.await.unwrap() else {
        panic!("expected a failure");
    };
    assert!(!retryable);
    assert!(
        message.starts_with("result of ")
            && message.ends_with(&format!(
                "exceeds the gateway's frame limit of {limit} bytes"
            )),
        "{message}"
    );
    assert!(
        gateway.core.registry().is_registered(id),
        "the worker stays"
    );
    // Control: a result within the limit is delivered on the same stream.
    let outcome = dispatch(&gateway.core, request("ns", "inflate", b"1000"));
    assert_eq!(
        outcome.await.unwrap(),
        ActivityOutcome::Completed(Bytes::from(vec![b'y'; 1000]))
    );
}

#[tokio::test]
async fn the_worker_drains_itself_through_its_handle_after_its_in_flight_work() {
    drain_waits_for_in_flight_work(DrainBy::Worker).await;
}

#[tokio::test]
async fn a_resize_is_announced_and_one_above_the_ceiling_is_refused_for_good() {
    let gateway = Gateway::builder()
        .registry(switchyard_core::Registry::builder().max_concurrency_limit(8))
        .start()
        .await;
    let mut events = gateway.core.registry().subscribe_events();
    let worker = sdk(&gateway)
        .activity("echo", echo)
        .max_concurrency(2)
        .connect()
        .await
        .unwrap();
    let handle = worker.handle();
    let (id, run) = running(&gateway, worker).await;

    handle.set_max_concurrency(5).unwrap();
    within("the new capacity to reach the gateway", async {
        loop {
            match events.recv().await.unwrap() {
                WorkerEvent::CapacityAnnounced {
                    worker,
                    capacity: 5,
                } if worker == id => break,
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(
        gateway.core.registry().worker(id).unwrap().capacity,
        Some(5)
    );

    handle.set_max_concurrency(9).unwrap();
    let error = within("the refused worker to stop", run)
        .await
        .unwrap()
        .unwrap_err();
    assert!(error.is_permanent(), "{error:?}");
    let Some(GrpcLinkError::Refused(status)) = error.link_error::<GrpcLinkError>() else {
        panic!("expected the gate's refusal, got {error:?}");
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("8"), "{}", status.message());
}

#[tokio::test]
async fn invalid_options_are_refused_before_dialling_naming_the_option() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let error = GrpcWorker::builder(format!("http://127.0.0.1:{port}"))
        .namespaces(["ns"])
        .activity("echo", echo)
        .max_concurrency(0)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            WorkerError::Invalid {
                field: "max_concurrency",
                ..
            }
        ),
        "{error:?}"
    );
    // Control: the same options with a capacity dial, and fail on the closed port instead.
    let unreachable = GrpcWorker::builder(format!("http://127.0.0.1:{port}"))
        .namespaces(["ns"])
        .activity("echo", echo)
        .connect()
        .await
        .unwrap_err();
    assert!(
        unreachable.link_error::<GrpcLinkError>().is_some(),
        "{unreachable:?}"
    );
}
