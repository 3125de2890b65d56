//! Closes that tell the worker what comes next: an operator's (or the worker's own) drain is
//! final, a shutdown asks it to come back, and what was queued before a close reaches the
//! worker before the close does.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{ActivityOutcome, WorkerEvent, WorkerId};
use switchyard_proto::v1::{
    QuicCancel, QuicCancelReason, QuicControlDown, QuicDrain, QuicDrainReason, QuicDrainRequest,
    quic_control_down, quic_control_up,
};
use switchyard_transport_quic::{Backoff, ErrorCode};

use crate::support::{Gateway, PATIENCE, Raw, event, register_frame};

/// A raw worker registered with capacity `n`, its capacity in force.
async fn announced(gateway: &Gateway, n: u32) -> (Raw, WorkerId) {
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::connect(gateway).await;
    let registered = raw.register(register_frame(&["work"])).await;
    raw.announce(n).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, .. } if *w == worker),
    )
    .await;
    (raw, worker)
}

fn drain(reason: QuicDrainReason) -> QuicControlDown {
    QuicControlDown {
        frame: Some(quic_control_down::Frame::Drain(QuicDrain {
            reason: reason.into(),
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_drained_worker_gets_the_drain_frame_before_the_final_close() {
    // Alternately the operator's drain and the worker's own drain_request, ten times: the
    // close used to overtake the drain frame every time.
    for round in 0..10 {
        let gateway = Gateway::start().await;
        let (mut raw, worker) = announced(&gateway, 1).await;
        if round % 2 == 0 {
            assert!(gateway.registry().drain_worker(worker));
        } else {
            raw.send_control(quic_control_up::Frame::DrainRequest(QuicDrainRequest {}))
                .await;
        }
        assert_eq!(
            raw.next_control().await,
            drain(QuicDrainReason::Requested),
            "round {round}: the drain frame arrives, saying the drain was requested"
        );
        let (code, reason) = raw.closed().await;
        assert_eq!(code, ErrorCode::Drained, "round {round}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_during_a_shutdown_is_told_to_come_back_later() {
    let gateway = Gateway::start().await;
    // Control: before the shutdown the same registration is admitted.
    let (_admitted, _) = announced(&gateway, 1).await;
    gateway.registry().broadcast_shutdown();
    let mut raw = Raw::connect(&gateway).await;
    raw.send_control(quic_control_up::Frame::Register(register_frame(&["work"])))
        .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ShuttingDown, "{reason}");
    assert!(!code.is_final(), "a worker refused now must come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_tells_an_idle_worker_to_come_back_later() {
    let gateway = Gateway::start().await;
    let (mut raw, _) = announced(&gateway, 2).await;
    gateway.core.shutdown(PATIENCE).await;
    assert_eq!(
        raw.next_control().await,
        drain(QuicDrainReason::ShuttingDown)
    );
    let (code, reason) = raw.closed().await;
    assert_eq!(
        code,
        ErrorCode::ShuttingDown,
        "not a final DRAINED: {reason}"
    );
    assert!(!code.is_final());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_cancel_reaches_a_busy_worker_every_time() {
    for round in 0..20 {
        let gateway = Arc::new(Gateway::start().await);
        let (mut raw, _) = announced(&gateway, 1).await;
        let dispatch = tokio::spawn({
            let gateway = Arc::clone(&gateway);
            async move { gateway.dispatch("work", b"held").await }
        });
        let (_lane, task) = raw.next_task().await;
        // The raw worker never answers: the grace ends with the task held.
        gateway.core.shutdown(Duration::from_millis(10)).await;
        gateway.server.shutdown().await;
        assert_eq!(
            raw.next_control().await,
            drain(QuicDrainReason::ShuttingDown),
            "round {round}"
        );
        let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no cancel before the close"));
        assert_eq!(
            cancel,
            Some(QuicCancel {
                task_id: task.task_id,
                reason: QuicCancelReason::ShuttingDown.into(),
            }),
            "round {round}"
        );
        let (code, _) = raw.closed().await;
        assert_eq!(code, ErrorCode::ShuttingDown, "round {round}");
        assert_eq!(dispatch.await.unwrap(), ActivityOutcome::ShuttingDown);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_comes_back_by_itself_after_a_shutdown_but_not_after_a_drain() {
    let first = Gateway::start().await;
    let fast = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let worker = first.worker().backoff(fast).connect().await.unwrap();
    let handle = worker.handle();
    let mut registrations = handle.registrations();
    let run = tokio::spawn(worker.run());
    first.core.shutdown(PATIENCE).await;
    first.server.shutdown().await;
    first.server.wait_idle().await;
    tokio::time::timeout(PATIENCE, registrations.wait_for(Option::is_none))
        .await
        .expect("the worker saw the shutdown")
        .unwrap();
    let (addr, ca) = (first.addr(), Arc::clone(&first.ca));
    drop(first);

    let second = Gateway::at(addr, ca, None).await;
    let again = tokio::time::timeout(PATIENCE, registrations.wait_for(Option::is_some))
        .await
        .expect("a worker told SHUTTING_DOWN registers again")
        .unwrap()
        .expect("registered");
    assert!(!run.is_finished(), "a shutdown is not a final drain");
    crate::support::eventually("eligible at the new gateway", || {
        second.census("echo").eligible == 1
    })
    .await;
    assert_eq!(
        second.dispatch("echo", b"back").await,
        ActivityOutcome::Completed("back".into())
    );

    // Control: the operator's drain is final, and `run` ends.
    assert!(second.registry().drain_worker(again));
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("a drained worker stops")
        .unwrap()
        .expect("cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drain_stays_final_through_a_shutdown() {
    let gateway = Arc::new(Gateway::start().await);
    let (mut raw, worker) = announced(&gateway, 1).await;
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"held").await }
    });
    let (_lane, task) = raw.next_task().await;
    assert!(gateway.registry().drain_worker(worker));
    assert_eq!(raw.next_control().await, drain(QuicDrainReason::Requested));
    gateway.core.shutdown(Duration::from_millis(10)).await;
    gateway.server.shutdown().await;
    let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
        .await
        .unwrap();
    assert_eq!(cancel.map(|c| c.task_id), Some(task.task_id));
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::Drained, "the final drain wins: {reason}");
    assert_eq!(dispatch.await.unwrap(), ActivityOutcome::ShuttingDown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_at_a_drain_deadline_says_so() {
    let gateway = Arc::new(Gateway::start().await);
    let (mut raw, worker) = announced(&gateway, 1).await;
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"held").await }
    });
    let (_lane, task) = raw.next_task().await;
    assert!(gateway.registry().drain_worker(worker));
    gateway
        .core
        .dispatcher()
        .cancel_held_by(worker, switchyard_core::CancelReason::DrainDeadline);
    let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
        .await
        .unwrap();
    assert_eq!(
        cancel,
        Some(QuicCancel {
            task_id: task.task_id,
            // Not REQUESTED: the producer did not cancel.
            reason: QuicCancelReason::DrainDeadline.into(),
        })
    );
    dispatch.abort();
}
