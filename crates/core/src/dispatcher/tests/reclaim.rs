//! Hung handlers: an ended task its worker neither answers nor acknowledges within
//! `cancel_ack_timeout` gives its slot back, and a worker that does it repeatedly is removed.

use std::time::Duration;

use crate::dispatcher::*;
use crate::events::{DisconnectReason, WorkerEvent};

use super::fixture::*;

fn reclaiming(timeout_secs: u64, max_unresponsive_tasks: u32) -> Setup {
    setup_with(DispatchConfig {
        cancel_ack_timeout: Duration::from_secs(timeout_secs),
        max_unresponsive_tasks,
        ..DispatchConfig::default()
    })
}

/// Lets spawned timers and dispatches run after a time jump (paused time stays put).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_ended_task_left_unanswered_frees_its_slot_after_the_ack_timeout() {
    let s = reclaiming(5, 3);
    let mut worker = s.worker(1).await;
    let hung = s.spawn(request("hung", Duration::from_secs(1)));
    let _task = worker.task().await;
    assert_eq!(hung.await.expect("joined"), ActivityOutcome::TimedOut);

    // Control: inside the timeout the slot stays held and a new dispatch parks.
    let next = s.spawn(request("next", Duration::from_secs(60)));
    s.parked(1).await;
    tokio::time::advance(Duration::from_secs(4)).await;
    settle().await;
    assert_eq!(
        s.in_flight(&worker),
        1,
        "held while the worker may still answer"
    );
    assert_eq!(s.dispatcher.pending_tasks(), 1);

    tokio::time::advance(Duration::from_secs(1)).await;
    settle().await;
    let served = worker.task().await;
    assert_eq!(
        &served.input[..],
        b"next",
        "the reclaimed slot serves the parked dispatch"
    );
    let snapshot = s.registry.worker(worker.id).expect("still registered");
    assert_eq!(snapshot.unresponsive, 1);
    assert_eq!(
        s.registry.pool_census(NS, "", ACTIVITY, None).unresponsive,
        1
    );
    s.dispatcher
        .complete(worker.id, served.task_id, success("next"))
        .expect("accepted");
    assert_eq!(next.await.expect("joined"), completed("next"));
}

#[tokio::test(start_paused = true)]
async fn an_acknowledged_cancel_is_not_counted_against_the_worker() {
    let s = reclaiming(5, 1);
    let mut worker = s.worker(1).await;
    let ended = s.spawn(request("x", Duration::from_secs(1)));
    let task = worker.task().await;
    assert_eq!(ended.await.expect("joined"), ActivityOutcome::TimedOut);
    s.dispatcher
        .cancel_acknowledged(worker.id, task.task_id)
        .expect("acknowledged");
    tokio::time::advance(Duration::from_secs(10)).await;
    settle().await;
    let snapshot = s
        .registry
        .worker(worker.id)
        .expect("a worker that let go stays");
    assert_eq!(snapshot.unresponsive, 0);
}

#[tokio::test(start_paused = true)]
async fn a_worker_reaching_the_unresponsive_limit_is_drained_and_removed() {
    let s = reclaiming(5, 2);
    let mut events = s.registry.subscribe_events();
    let mut worker = s.worker(2).await;
    for round in 0..2 {
        let hung = s.spawn(request("hung", Duration::from_secs(1)));
        let _task = worker.task().await;
        assert_eq!(hung.await.expect("joined"), ActivityOutcome::TimedOut);
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
        if round == 0 {
            // Control: one reclaimed task marks the worker but keeps it.
            assert_eq!(
                s.registry.worker(worker.id).map(|w| w.unresponsive),
                Some(1)
            );
        }
    }
    assert!(
        s.registry.worker(worker.id).is_none(),
        "removed at the limit"
    );
    let drained = worker
        .sent()
        .into_iter()
        .any(|message| matches!(message, WorkerMessage::Drain));
    assert!(drained, "the worker was told to drain");
    let mut reasons = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let WorkerEvent::Disconnected { reason, .. } = event {
            reasons.push(reason);
        }
    }
    assert_eq!(reasons, vec![DisconnectReason::Unresponsive]);
}
