//! One entry point for results: unknown, foreign, duplicate and late ones are refused.

use std::time::Duration;

use crate::dispatcher::*;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn results_for_tasks_a_worker_does_not_hold_are_refused_counted_and_never_delivered() {
    let s = setup();
    let mut holder = s.worker(1).await;
    let stranger = s.worker(1).await;
    let running = s.spawn(request("mine", Duration::from_secs(30)));
    let task = holder.task().await;

    assert_eq!(
        s.dispatcher
            .complete(stranger.id, task.task_id, success("forged")),
        Err(CompletionRefused::NotHeldByWorker {
            task: task.task_id,
            worker: stranger.id
        })
    );
    let unknown = TaskId::from_raw(task.task_id.get() + 1000);
    assert_eq!(
        s.dispatcher.complete(holder.id, unknown, success("forged")),
        Err(CompletionRefused::UnknownTask { task: unknown })
    );
    assert_eq!(
        s.dispatcher.refused(),
        RefusedCounts {
            unknown: 1,
            foreign: 1,
            late: 0
        }
    );
    assert!(!running.is_finished(), "a refused result ends nothing");

    s.dispatcher
        .complete(holder.id, task.task_id, success("mine"))
        .expect("the holder's result is accepted");
    assert_eq!(running.await.expect("joined"), completed("mine"));
    assert_eq!(
        s.dispatcher
            .complete(holder.id, task.task_id, success("again")),
        Err(CompletionRefused::UnknownTask { task: task.task_id }),
        "a duplicate result finds nothing pending"
    );
    assert_eq!(s.dispatcher.refused().unknown, 2);
}

#[tokio::test(start_paused = true)]
async fn a_result_instead_of_a_cancel_ack_frees_the_slot_and_is_not_a_refusal() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("slow", Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }]
    );
    assert_eq!(s.in_flight(&worker), 1, "the worker still runs it");
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("slow")),
        Ok(()),
        "answered instead of acknowledging the cancel: accepted like a cancel_ack"
    );
    assert_eq!(s.dispatcher.refused(), RefusedCounts::default());
    assert_eq!(s.dispatcher.results_after_cancel(), 1);
    assert_eq!(s.in_flight(&worker), 0, "the answer lets go of the slot");
    let next = s.spawn(request("next", Duration::from_secs(5)));
    let second = worker.task().await;
    s.dispatcher
        .complete(worker.id, second.task_id, success("next"))
        .expect("served on the freed slot");
    assert_eq!(next.await.expect("joined"), completed("next"));
    assert_eq!(
        s.dispatcher.results_after_cancel(),
        1,
        "an ordinary result is not counted as one after a cancel"
    );
    // Control: a result for the same task again finds nothing held and is refused.
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("again")),
        Err(CompletionRefused::UnknownTask { task: task.task_id })
    );
    assert_eq!(s.dispatcher.refused().unknown, 1);
}

#[tokio::test(start_paused = true)]
async fn a_result_after_a_producer_cancel_is_taken_as_the_acknowledgement() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-r"));
    let task = worker.task().await;
    s.dispatcher
        .cancel(&caller(), NS, "job-r")
        .expect("in flight");
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
    assert_eq!(
        s.in_flight(&worker),
        1,
        "control: the cancelled task holds its slot"
    );
    assert_eq!(
        s.dispatcher
            .complete(worker.id, task.task_id, success("done anyway")),
        Ok(())
    );
    assert_eq!(s.in_flight(&worker), 0);
    assert_eq!(s.dispatcher.refused(), RefusedCounts::default());
    assert_eq!(
        s.dispatcher.cancel_acknowledged(worker.id, task.task_id),
        Err(CompletionRefused::UnknownTask { task: task.task_id }),
        "a cancel_ack after the result finds nothing held"
    );
}
