//! Tasks, cancels, drains, lost connections and moving workers, SDK to gateway.

use std::sync::Arc;

use bytes::Bytes;
use switchyard_core::{
    ActivityOutcome, CallerIdentity, DisconnectReason, Eligibility, WorkerEvent,
};
use switchyard_transport_quic::{ActivityContext, ActivityError, ErrorCode};
use tokio::sync::mpsc;

use crate::capacity::Gate;
use crate::support::{Gateway, NS, PATIENCE, Raw, event, eventually, register_frame, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_failures_and_panics_reach_the_producer() {
    let gateway = Gateway::start().await;
    let worker = gateway
        .worker()
        .max_concurrency(4)
        .activity("fail", |_ctx: ActivityContext, _input: Bytes| async move {
            Err::<Bytes, _>(ActivityError::retryable("try later"))
        })
        .activity("boom", |_ctx: ActivityContext, _input: Bytes| async move {
            if true {
                panic!("handler bug");
            }
            Ok(Bytes::new())
        })
        .connect()
        .await
        .unwrap();
    tokio::spawn(worker.run());
    assert_eq!(
        gateway.dispatch("echo", b"hello").await,
        ActivityOutcome::Completed("hello".into())
    );
    assert_eq!(
        gateway.dispatch("fail", b"").await,
        ActivityOutcome::Failed {
            message: "try later".into(),
            retryable: true
        }
    );
    let outcome = gateway.dispatch("boom", b"").await;
    assert!(
        matches!(&outcome, ActivityOutcome::Failed { message, retryable: false } if message.contains("handler bug")),
        "{outcome:?}"
    );
    // The lane that ran the panicking handler still serves.
    for _ in 0..8 {
        assert_eq!(
            gateway.dispatch("echo", b"again").await,
            ActivityOutcome::Completed("again".into())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_the_running_handler_and_frees_the_slot() {
    let gateway = Arc::new(Gateway::start().await);
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let worker = gateway
        .worker()
        .activity("wait", move |ctx: ActivityContext, _input: Bytes| {
            let (started_tx, seen_tx) = (started_tx.clone(), seen_tx.clone());
            async move {
                let _ = started_tx.send(());
                ctx.cancelled().await;
                let _ = seen_tx.send(ctx.task_id());
                Err::<Bytes, _>(ActivityError::fatal("stopped"))
            }
        })
        .connect()
        .await
        .unwrap();
    let id = worker.worker_id();
    tokio::spawn(worker.run());
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move {
            let mut request = request("wait", b"", PATIENCE);
            request.activity_id = Some("a1".into());
            gateway.dispatch_with(request).await
        }
    });
    tokio::time::timeout(PATIENCE, started.recv())
        .await
        .unwrap();
    assert_eq!(gateway.registry().worker(id).unwrap().in_flight, 1);
    gateway
        .core
        .dispatcher()
        .cancel(&CallerIdentity::trusted("test"), NS, "a1")
        .unwrap();
    assert_eq!(dispatch.await.unwrap(), ActivityOutcome::Cancelled);
    tokio::time::timeout(PATIENCE, seen.recv())
        .await
        .expect("the handler never saw the cancel");
    eventually("the cancel acknowledgement frees the slot", || {
        gateway.registry().worker(id).unwrap().in_flight == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_lets_the_running_task_finish_then_closes_the_connection() {
    let gateway = Arc::new(Gateway::start().await);
    let mut events = gateway.registry().subscribe_events();
    let (builder, mut gate) = Gate::install(gateway.worker(), "hold");
    let worker = builder.connect().await.unwrap();
    let id = worker.worker_id();
    let run = tokio::spawn(worker.run());
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("hold", b"kept").await }
    });
    gate.next_start().await;
    assert!(gateway.registry().drain_worker(id));
    assert_eq!(
        gateway.registry().worker(id).unwrap().eligibility,
        Eligibility::Draining
    );
    // Still registered and still connected while its task runs.
    assert!(!run.is_finished());
    gate.release.add_permits(1);
    assert_eq!(
        dispatch.await.unwrap(),
        ActivityOutcome::Completed("kept".into())
    );
    tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap()
        .unwrap()
        .expect("a drained worker stops cleanly");
    event(&mut events, "drained", |e| {
        matches!(e, WorkerEvent::Disconnected { worker, reason: DisconnectReason::Drained } if *worker == id)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_asks_to_drain_stops_cleanly() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let worker = gateway.worker().connect().await.unwrap();
    let id = worker.worker_id();
    let handle = worker.handle();
    let run = tokio::spawn(worker.run());
    handle.drain().unwrap();
    tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    event(&mut events, "drained", |e| {
        matches!(e, WorkerEvent::Disconnected { worker, reason: DisconnectReason::Drained } if *worker == id)
    })
    .await;
    assert!(handle.worker_id().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_loss_mid_task_dispatches_it_again_elsewhere() {
    let gateway = Arc::new(Gateway::start().await);
    let mut events = gateway.registry().subscribe_events();
    let mut lost = Raw::connect(&gateway).await;
    let registered = lost.register(register_frame(&["work"])).await;
    lost.announce(1).await;
    let lost_id = switchyard_core::WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "raw worker announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker, .. } if *worker == lost_id),
    )
    .await;
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"payload").await }
    });
    let (_, task) = lost.next_task().await;
    assert_eq!(task.attempt, 1);

    // A second worker joins only now, so the first delivery could not have gone to it.
    let survivor = gateway
        .worker()
        .activity("work", |ctx: ActivityContext, input: Bytes| async move {
            let mut output = input.to_vec();
            output.extend_from_slice(format!(" attempt {}", ctx.attempt()).as_bytes());
            Ok::<_, ActivityError>(Bytes::from(output))
        })
        .connect()
        .await
        .unwrap();
    tokio::spawn(survivor.run());
    lost.conn
        .close(ErrorCode::Closed.var_int(), b"pulled the plug");
    assert_eq!(
        dispatch.await.unwrap(),
        ActivityOutcome::Completed("payload attempt 2".into())
    );
    event(&mut events, "lost worker deregistered", |e| {
        // Closed with `CLOSED`: the worker's own close, so it leaves at once (no suspension).
        matches!(e, WorkerEvent::Disconnected { worker, reason: DisconnectReason::Closed } if *worker == lost_id)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_changes_address_keeps_its_registration_and_its_tasks() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let worker = gateway.worker().max_concurrency(2).connect().await.unwrap();
    let id = worker.worker_id();
    let handle = worker.handle();
    tokio::spawn(worker.run());
    assert_eq!(
        gateway.dispatch("echo", b"before").await,
        ActivityOutcome::Completed("before".into())
    );
    let before = handle.local_addr().unwrap();
    handle
        .rebind(std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let after = handle.local_addr().unwrap();
    assert_ne!(before.port(), after.port(), "the worker moved");
    for _ in 0..4 {
        let outcome = tokio::time::timeout(
            PATIENCE,
            gateway.dispatch_with(request("echo", b"after", PATIENCE)),
        )
        .await
        .unwrap();
        assert_eq!(outcome, ActivityOutcome::Completed("after".into()));
    }
    assert_eq!(handle.worker_id(), Some(id), "same registration");
    assert!(gateway.registry().is_registered(id));
    assert_eq!(gateway.registry().len(), 1);
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(event, WorkerEvent::Disconnected { .. }),
            "the worker was deregistered: {event:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_token_stops_the_worker_and_its_task_moves_on() {
    let gateway = Arc::new(Gateway::start().await);
    let mut events = gateway.registry().subscribe_events();
    let (builder, mut gate) = Gate::install(gateway.worker(), "hold");
    let stopped = builder.connect().await.unwrap();
    let stopped_id = stopped.worker_id();
    let stop = stopped.shutdown_token();
    let run = tokio::spawn(stopped.run());
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("hold", b"moved").await }
    });
    let first = gate.next_start().await;

    let (builder, mut rescue) = Gate::install(gateway.worker(), "hold");
    let rescuer = builder.connect().await.unwrap();
    tokio::spawn(rescuer.run());
    stop.cancel();
    tokio::time::timeout(PATIENCE, run)
        .await
        .unwrap()
        .unwrap()
        .expect("a stopped worker returns Ok");
    event(&mut events, "stopped worker deregistered", |e| {
        matches!(e, WorkerEvent::Disconnected { worker, reason: DisconnectReason::Closed } if *worker == stopped_id)
    })
    .await;
    let second = rescue.next_start().await;
    assert_ne!(
        first, second,
        "the task was delivered again, under a new task id"
    );
    rescue.release.add_permits(1);
    assert_eq!(
        dispatch.await.unwrap(),
        ActivityOutcome::Completed("moved".into())
    );
}
