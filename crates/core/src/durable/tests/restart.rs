//! A restart: the durable dispatcher and dispatcher dropped, new ones started over the same
//! store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::address::WorkerId;
use crate::durable::{DispatchId, DispatchState, DispatchStore, NewDispatch};
use crate::outcome::ActivityOutcome;
use crate::registry::UnservedReason;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn after_a_restart_queued_ones_run_and_running_ones_run_again_with_the_next_attempt() {
    let store = memory();
    let alice = producer("alice");
    let gw = start(Arc::clone(&store)).await;
    let mut worker = gw.setup.worker(1).await;
    let finished = gw.submit(&alice, "finished").await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("finished"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &finished, Duration::from_secs(10))
            .await,
        Ok(Some(completed("finished")))
    );
    let running = gw.submit(&alice, "running").await;
    assert_eq!(worker.task().await.attempt, 1);
    gw.until_row(&running, "running").await;
    let queued = gw.submit(&alice, "queued").await;
    gw.setup.parked(1).await;
    gw.stop().await;
    drop(worker);

    let gw = start(Arc::clone(&store)).await;
    let mut worker = gw.setup.worker(4).await;
    let mut attempts = std::collections::BTreeMap::new();
    for _ in 0..2 {
        let task = worker.task().await;
        let input = String::from_utf8_lossy(&task.input).into_owned();
        gw.setup
            .dispatcher
            .complete(worker.id, task.task_id, success(&input))
            .expect("pending");
        attempts.insert(input, task.attempt);
    }
    assert_eq!(
        attempts,
        [("queued".to_owned(), 1), ("running".to_owned(), 2)].into(),
        "the running one is delivered again as attempt 2"
    );
    for (id, input) in [(&running, "running"), (&queued, "queued")] {
        assert_eq!(
            gw.durable
                .await_outcome(&alice, id, Duration::from_secs(10))
                .await,
            Ok(Some(completed(input)))
        );
    }
    // Control: the finished one keeps its outcome and is not delivered again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(worker.sent().is_empty(), "the finished one ran again");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &finished, Duration::ZERO)
            .await,
        Ok(Some(completed("finished")))
    );
}

#[tokio::test(start_paused = true)]
async fn shutting_down_is_not_recorded_and_the_dispatch_runs_after_the_restart() {
    let store = memory();
    let alice = producer("alice");
    let gw = start(Arc::clone(&store)).await;
    let id = gw.submit(&alice, "later").await;
    gw.setup.parked(1).await;
    gw.stop().await;
    let row = store.get(&id).await.expect("reads").expect("recorded");
    assert!(
        matches!(row.state, DispatchState::Queued { .. }),
        "left unfinished, not recorded `shutting_down`: {:?}",
        row.state
    );

    let gw = start(Arc::clone(&store)).await;
    let mut worker = gw.setup.worker(1).await;
    let task = worker.task().await;
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("later"))
        .expect("pending");
    // Control: the outcome after the restart is the worker's, the only one recorded.
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(completed("later")))
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_its_worker_finishes_within_the_drain_timeout_has_that_outcome_recorded() {
    let store = memory();
    let alice = producer("alice");
    let gw = start(Arc::clone(&store)).await;
    let mut worker = gw.setup.worker(1).await;
    let id = gw.submit(&alice, "drained").await;
    let task = worker.task().await;

    // The gateway's order: the durable dispatcher first, then core's drain.
    gw.durable.shutdown();
    let dispatcher = gw.setup.dispatcher.clone();
    let drain = tokio::spawn(async move { dispatcher.shutdown(Duration::from_secs(30)).await });
    // The worker hears the shutdown, then finishes its task inside the drain.
    loop {
        match worker.rx.recv().await {
            Some(crate::WorkerMessage::ShuttingDown) => break,
            Some(_) => {}
            None => panic!("the worker's link closed before the shutdown was announced"),
        }
    }
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("drained"))
        .expect("accepted during the drain");
    drain.await.expect("the drain ends");
    gw.durable.drivers_ended().await;

    let row = store.get(&id).await.expect("reads").expect("recorded");
    match row.state {
        DispatchState::Finished { outcome, .. } => {
            assert_eq!(
                (outcome.kind.as_str(), &outcome.output[..]),
                ("completed", &b"drained"[..])
            );
        }
        other => panic!("the outcome finished in the drain was not recorded: {other:?}"),
    }
}

fn past_deadline(principal: &str, input: &str) -> NewDispatch {
    let now = SystemTime::now();
    NewDispatch {
        id: DispatchId::generate(),
        namespace: NS.to_owned(),
        task_queue: crate::DEFAULT_TASK_QUEUE.to_owned(),
        activity_type: ACTIVITY.to_owned(),
        node: None,
        input: input.to_owned().into(),
        principal: principal.to_owned(),
        idempotency_key: None,
        submitted_at: now - Duration::from_secs(120),
        deadline: now - Duration::from_secs(1),
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passed_during_the_restart_ends_timed_out_if_running_else_unserved() {
    let store = memory();
    let was_running = past_deadline("alice", "was running");
    let was_queued = past_deadline("alice", "was queued");
    let mut in_time = past_deadline("alice", "in time");
    in_time.deadline = SystemTime::now() + Duration::from_secs(3600);
    for dispatch in [&was_running, &was_queued, &in_time] {
        store.record(dispatch.clone()).await.expect("recorded");
    }
    store
        .claim(&was_running.id, WorkerId::from_raw(9), 1)
        .await
        .expect("claimed");

    let gw = start(Arc::clone(&store)).await;
    let alice = producer("alice");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &was_running.id, Duration::from_secs(10))
            .await,
        Ok(Some(ActivityOutcome::TimedOut))
    );
    let unserved = gw
        .durable
        .await_outcome(&alice, &was_queued.id, Duration::from_secs(10))
        .await;
    assert!(
        matches!(&unserved, Ok(Some(ActivityOutcome::Unserved { reason: UnservedReason::NoWorkers, detail }))
            if detail.contains("restarted")),
        "{unserved:?}"
    );
    // Control: one with time left is not ended; it waits for a worker.
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &in_time.id, Duration::from_secs(10))
            .await,
        Ok(None)
    );
    let mut worker = gw.setup.worker(1).await;
    assert_eq!(&worker.task().await.input[..], b"in time");
}

#[tokio::test(start_paused = true)]
async fn adopted_dispatches_run_once_each_like_resumed_ones() {
    let store = memory();
    let alice = producer("alice");
    let gw = start(Arc::clone(&store)).await;
    let mut worker = gw.setup.worker(4).await;
    // Recorded after the start, as another node would have: nothing drives it yet.
    let mut handed = past_deadline("alice", "handed over");
    handed.submitted_at = SystemTime::now();
    handed.deadline = SystemTime::now() + Duration::from_secs(60);
    let id = handed.id.clone();
    store.record(handed).await.expect("recorded");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        worker.sent().is_empty(),
        "control: not driven before it is adopted"
    );
    let row = gw.row(&id).await;
    gw.durable.adopt(vec![row.clone()]);
    gw.durable.adopt(vec![row]);
    let task = worker.task().await;
    assert_eq!(&task.input[..], b"handed over");
    gw.setup
        .dispatcher
        .complete(worker.id, task.task_id, success("adopted"))
        .expect("pending");
    assert_eq!(
        gw.durable
            .await_outcome(&alice, &id, Duration::from_secs(10))
            .await,
        Ok(Some(completed("adopted")))
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(worker.sent().is_empty(), "adopted twice, delivered once");
}
