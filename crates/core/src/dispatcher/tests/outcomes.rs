//! Exactly one terminal outcome per dispatch, of each kind.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::dispatcher::*;
use crate::registry::UnservedReason;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn worker_results_become_completed_or_failed() {
    let s = setup();
    let mut worker = s.worker(2).await;
    let ok = s.spawn(request("ok", Duration::from_secs(30)));
    let bad = s.spawn(request("bad", Duration::from_secs(30)));
    for _ in 0..2 {
        let task = worker.task().await;
        let result = if &task.input[..] == b"ok" {
            success("out")
        } else {
            TaskResult::Failure {
                message: "boom".to_owned(),
                retryable: false,
            }
        };
        s.dispatcher
            .complete(worker.id, task.task_id, result)
            .expect("accepted");
    }
    assert_eq!(ok.await.expect("joined"), completed("out"));
    assert_eq!(
        bad.await.expect("joined"),
        ActivityOutcome::Failed {
            message: "boom".to_owned(),
            retryable: false
        }
    );
    assert_eq!(s.dispatcher.pending_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passing_while_parked_is_unserved_with_the_reason() {
    let s = setup();
    let started = Instant::now();
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(3)))
        .await
        .expect("accepted");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    let ActivityOutcome::Unserved { reason, detail } = outcome else {
        panic!("expected unserved, got {outcome:?}");
    };
    assert_eq!(reason, UnservedReason::NoWorkers);
    assert!(detail.starts_with("no_workers"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_result_arriving_as_the_deadline_passes_is_not_lost() {
    // The dispatch is polled by hand so that, when it looks, both its result and its deadline
    // are ready; `select!` then picks a branch at random. The result core accepted must win.
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    for round in 0..16 {
        let s = setup();
        let mut worker = s.worker(1).await;
        let producer = caller();
        let mut dispatch = std::pin::pin!(
            s.dispatcher
                .dispatch(&producer, request("x", Duration::from_secs(5)))
        );
        assert!(dispatch.as_mut().poll(&mut context).is_pending());
        let task = worker.task().await;
        tokio::time::advance(Duration::from_secs(6)).await;
        s.dispatcher
            .complete(worker.id, task.task_id, success("x"))
            .expect("the dispatch has not looked at its deadline yet");
        let std::task::Poll::Ready(outcome) = dispatch.as_mut().poll(&mut context) else {
            panic!("round {round}: both wake-ups are ready");
        };
        assert_eq!(outcome, Ok(completed("x")), "round {round}");
        assert!(
            worker.sent().is_empty(),
            "round {round}: no cancel for a finished task"
        );
    }
}
