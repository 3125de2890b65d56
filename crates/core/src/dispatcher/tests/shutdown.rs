//! Drain and shutdown.

use std::time::Duration;

use futures::FutureExt;

use tokio::time::Instant;

use crate::dispatcher::*;
use crate::registry::UnservedReason;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn a_drained_worker_gets_no_new_work_and_finishes_what_it_holds() {
    let s = setup();
    let mut worker = s.worker(2).await;
    let running = s.spawn(request("held", Duration::from_secs(30)));
    let task = worker.task().await;
    assert!(s.registry.drain_worker(worker.id));
    assert_eq!(worker.sent(), vec![WorkerMessage::Drain]);
    let refused = s
        .dispatcher
        .dispatch(&caller(), request("new", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(
            refused,
            ActivityOutcome::Unserved {
                reason: UnservedReason::Draining,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(worker.sent().is_empty(), "no task after the drain");
    s.dispatcher
        .complete(worker.id, task.task_id, success("held"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("held"));
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_new_work_lets_in_flight_finish_and_ends_parked_ones() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let in_flight = s.spawn(request("finish", Duration::from_secs(60)));
    let task = worker.task().await;
    let mut elsewhere = request("parked", Duration::from_secs(60));
    elsewhere.activity_type = "unserved".to_owned();
    let parked = s.spawn(elsewhere);
    s.parked(1).await;

    let dispatcher = s.dispatcher.clone();
    let shutdown = tokio::spawn(async move { dispatcher.shutdown(Duration::from_secs(10)).await });
    assert_eq!(parked.await.expect("joined"), ActivityOutcome::ShuttingDown);
    assert_eq!(worker.sent(), vec![WorkerMessage::ShuttingDown]);
    assert_eq!(
        s.dispatcher
            .dispatch(&caller(), request("late", Duration::from_secs(1)))
            .await,
        Ok(ActivityOutcome::ShuttingDown)
    );
    tokio::time::advance(Duration::from_secs(3)).await;
    s.dispatcher
        .complete(worker.id, task.task_id, success("finish"))
        .expect("accepted within grace");
    assert_eq!(in_flight.await.expect("joined"), completed("finish"));
    let started = Instant::now();
    shutdown.await.expect("joined");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "shutdown returns once nothing is in flight"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_what_is_still_running_after_the_grace_with_one_outcome_each() {
    let s = setup();
    let mut worker = s.worker(3).await;
    let running: Vec<_> = (0..3)
        .map(|i| s.spawn(request(&format!("r{i}"), Duration::from_secs(60))))
        .collect();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(worker.task().await);
    }
    let dispatcher = s.dispatcher.clone();
    let shutdown = tokio::spawn(async move { dispatcher.shutdown(Duration::from_secs(5)).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // One finishes within the grace; two never answer.
    s.dispatcher
        .complete(worker.id, tasks[0].task_id, success("r0"))
        .expect("accepted");
    shutdown.await.expect("joined");
    let mut outcomes = Vec::new();
    for running in running {
        outcomes.push(running.await.expect("joined"));
    }
    assert_eq!(
        outcomes,
        vec![
            completed("r0"),
            ActivityOutcome::ShuttingDown,
            ActivityOutcome::ShuttingDown
        ]
    );
    let cancels: Vec<_> = worker
        .sent()
        .into_iter()
        .filter(|m| {
            matches!(
                m,
                WorkerMessage::Cancel {
                    reason: CancelReason::ShuttingDown,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        cancels.len(),
        2,
        "the unfinished tasks are cancelled on the worker"
    );
}

/// A dispatch that has selected its worker when shutdown begins, and not yet tracked its task,
/// must not deliver it: shutdown counts only tracked tasks before it stops waiting, so a task
/// delivered after that count would run while its dispatch ends `ShuttingDown`.
#[tokio::test(start_paused = true)]
async fn a_task_selected_as_shutdown_begins_is_not_delivered() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let dispatcher = s.dispatcher.clone();
    s.dispatcher.after_next_selection(move || {
        // Nothing is tracked yet, so shutdown runs to its end in one poll.
        let finished = dispatcher
            .shutdown(Duration::from_secs(10))
            .now_or_never()
            .is_some();
        assert!(finished, "shutdown waits for nothing");
    });
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("raced", Duration::from_secs(60)))
        .await;
    assert_eq!(outcome, Ok(ActivityOutcome::ShuttingDown));
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::ShuttingDown],
        "no task went out after shutdown began"
    );
    assert_eq!(s.dispatcher.pending_tasks(), 0, "nothing left tracked");
}
