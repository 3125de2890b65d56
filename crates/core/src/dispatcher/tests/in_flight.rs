//! The in-flight count follows tracking and completion; a task tracked twice counts once.

use std::sync::Arc;
use std::time::Duration;

use crate::delivery::WorkerDelivery;
use crate::dispatcher::*;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn the_in_flight_count_rises_on_tracking_and_falls_on_completion() {
    let s = setup();
    let mut worker = s.worker(2).await;
    assert_eq!(s.in_flight(&worker), 0);
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    assert_eq!(s.in_flight(&worker), 1);
    assert_eq!(s.dispatcher.pending_tasks(), 1);
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(s.in_flight(&worker), 0);
    assert_eq!(s.dispatcher.pending_tasks(), 0);
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_free_before_the_caller_hears_back() {
    // A producer dispatching one after another to a worker of capacity 1 must never find the
    // worker still full from the previous task: one selection per dispatch, no parking.
    const ROUNDS: u64 = 300;
    let s = setup();
    let mut worker = s.worker(1).await;
    let dispatcher = s.dispatcher.clone();
    let id = worker.id;
    let responder = tokio::spawn(async move {
        while let Some(message) = worker.rx.recv().await {
            if let WorkerMessage::Task(task) = message {
                let _ = dispatcher.complete(id, task.task_id, TaskResult::Success(task.input));
            }
        }
    });
    for round in 0..ROUNDS {
        let outcome = s
            .dispatcher
            .dispatch(&caller(), request("x", Duration::from_secs(10)))
            .await
            .expect("accepted");
        assert_eq!(outcome, completed("x"), "round {round}");
    }
    assert_eq!(s.dispatcher.selections(), ROUNDS);
    assert_eq!(s.dispatcher.unserved_warnings(), 0);
    responder.abort();
}

#[tokio::test(start_paused = true)]
async fn a_task_tracked_twice_holds_one_slot() {
    let s = setup();
    let worker = s.worker(4).await;
    let reserve = || {
        s.registry
            .select_and_reserve(NS, "", ACTIVITY, None)
            .map(|(_, reservation)| reservation)
            .expect("a free slot")
    };
    let mut table = TaskTable::default();
    let task = TaskId::from_raw(7);
    let pending = |reservation| {
        PendingTask::new(
            Arc::clone(&worker.leg) as Arc<dyn WorkerDelivery>,
            reservation,
            None,
            false,
        )
    };
    assert!(table.insert(task, pending(reserve())).is_none());
    assert_eq!(s.in_flight(&worker), 1);
    let replaced = table.insert(task, pending(reserve()));
    assert!(replaced.is_some(), "the first entry is handed back");
    drop(replaced);
    assert_eq!(s.in_flight(&worker), 1, "one task, one slot");
    assert_eq!(table.len(), 1);
    assert_eq!(table.worker_lost(worker.id).len(), 1);
    assert_eq!(s.in_flight(&worker), 0);
}
