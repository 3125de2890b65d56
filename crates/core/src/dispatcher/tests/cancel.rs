//! Cancel and deadline send a cancel on the task's delivery and end the dispatch at once; the
//! slot is freed on acknowledgement or departure.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::dispatcher::*;
use crate::eligibility::Eligibility;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_dispatch_at_once_and_holds_the_slot_until_acknowledged() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let _other = s.worker(1).await;
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-1"));
    let task = worker.task().await;
    s.dispatcher
        .cancel(&caller(), NS, "job-1")
        .expect("in flight");
    let started = Instant::now();
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
    assert_eq!(started.elapsed(), Duration::ZERO, "ended at once");
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::Requested
        }]
    );
    assert!(matches!(
        s.eligibility(&worker),
        Eligibility::AtCapacity { .. }
    ));
    let census = s.registry.pool_census(NS, "", ACTIVITY, None);
    assert_eq!((census.at_capacity, census.eligible), (1, 1));
    s.dispatcher
        .cancel_acknowledged(worker.id, task.task_id)
        .expect("acknowledged");
    assert_eq!(s.eligibility(&worker), Eligibility::Eligible);
    assert_eq!(
        s.dispatcher.cancel_acknowledged(worker.id, task.task_id),
        Err(CompletionRefused::UnknownTask { task: task.task_id })
    );
}

#[tokio::test(start_paused = true)]
async fn the_deadline_sends_a_cancel_and_the_slot_is_freed_when_the_worker_leaves() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }]
    );
    assert_eq!(
        s.dispatcher.pending_tasks(),
        1,
        "held until the worker lets go"
    );
    worker.leave();
    assert_eq!(s.dispatcher.pending_tasks(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_what_a_worker_holds_ends_only_its_dispatches() {
    let s = setup();
    let mut drained = s.worker(2).await;
    let mut other = s.worker(2).await;
    let mut running: HashMap<String, JoinHandle<ActivityOutcome>> = (0..4)
        .map(|i| {
            let input = format!("d{i}");
            (
                input.clone(),
                s.spawn(request(&input, Duration::from_secs(30))),
            )
        })
        .collect();
    let held = [drained.task().await, drained.task().await];
    let kept = [other.task().await, other.task().await];
    // Control: a worker holding nothing has nothing cancelled.
    assert_eq!(
        s.dispatcher
            .cancel_held_by(WorkerId::from_raw(u64::MAX), CancelReason::Requested),
        0
    );

    assert_eq!(
        s.dispatcher
            .cancel_held_by(drained.id, CancelReason::Requested),
        2
    );
    let cancelled: BTreeSet<TaskId> = drained
        .sent()
        .into_iter()
        .map(|message| match message {
            WorkerMessage::Cancel { task_id, reason } => {
                assert_eq!(reason, CancelReason::Requested);
                task_id
            }
            other => panic!("only cancels were expected, got {other:?}"),
        })
        .collect();
    assert_eq!(cancelled, held.iter().map(|t| t.task_id).collect());
    for task in &held {
        let input = String::from_utf8(task.input.to_vec()).expect("utf-8 input");
        let handle = running.remove(&input).expect("a dispatch per input");
        assert_eq!(handle.await.expect("joined"), ActivityOutcome::Cancelled);
    }
    assert!(other.sent().is_empty(), "the other worker is not touched");
    assert_eq!(
        s.dispatcher.pending_tasks(),
        4,
        "slots held until the workers let go"
    );
    for task in &kept {
        let input = String::from_utf8(task.input.to_vec()).expect("utf-8 input");
        s.dispatcher
            .complete(other.id, task.task_id, success(&input))
            .expect("pending");
        let handle = running.remove(&input).expect("a dispatch per input");
        assert_eq!(handle.await.expect("joined"), completed(&input));
    }
    assert_eq!(
        s.dispatcher
            .cancel_held_by(drained.id, CancelReason::Requested),
        0,
        "already cancelled"
    );
}

#[tokio::test(start_paused = true)]
async fn an_acknowledgement_for_a_task_nobody_cancelled_changes_nothing() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    assert!(
        s.dispatcher
            .cancel_acknowledged(worker.id, task.task_id)
            .is_err()
    );
    assert_eq!(s.in_flight(&worker), 1);
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn cancel_reaches_a_parked_dispatch_and_refuses_unknown_or_foreign_ids() {
    let s = setup();
    let running = s.spawn(with_id(request("x", Duration::from_secs(30)), "job-2"));
    s.parked(1).await;
    assert!(matches!(
        s.dispatcher.cancel(&caller(), NS, "job-unknown"),
        Err(CancelError::NotFound { .. })
    ));
    let outsider = CallerIdentity::granted("outsider", ["elsewhere"]);
    assert!(matches!(
        s.dispatcher.cancel(&outsider, NS, "job-2"),
        Err(CancelError::NamespaceNotGranted { .. })
    ));
    assert!(!running.is_finished());
    s.dispatcher.cancel(&caller(), NS, "job-2").expect("parked");
    assert_eq!(running.await.expect("joined"), ActivityOutcome::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn a_caller_dropping_its_dispatch_cancels_the_task_on_the_worker() {
    let s = setup();
    let mut worker = s.worker(1).await;
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = worker.task().await;
    running.abort();
    assert!(running.await.is_err());
    assert_eq!(
        worker.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::CallerGone
        }]
    );
    assert_eq!(s.in_flight(&worker), 1, "held until acknowledged");
}

fn spawn_as(
    s: &Setup,
    caller: CallerIdentity,
    request: ActivityRequest,
) -> JoinHandle<Result<ActivityOutcome, DispatchError>> {
    let dispatcher = s.dispatcher.clone();
    tokio::spawn(async move { dispatcher.dispatch(&caller, request).await })
}

#[tokio::test(start_paused = true)]
async fn activity_ids_belong_to_their_principal_unless_the_caller_operates_the_namespace() {
    use crate::role::Role;
    let s = setup();
    let alice = CallerIdentity::granted("alice", [NS]).with_roles([Role::Producer]);
    let bob = CallerIdentity::granted("bob", [NS]).with_roles([Role::Producer]);
    let operator = CallerIdentity::granted("ops", [NS]).with_roles([Role::Operator]);
    let a1 = spawn_as(
        &s,
        alice.clone(),
        with_id(request("a", Duration::from_secs(30)), "job"),
    );
    s.parked(1).await;

    // Bob neither sees nor reaches Alice's id: his cancel is the unknown-id answer, and his
    // own dispatch with the same id is accepted (it parks next to hers).
    let bobs_cancel = s.dispatcher.cancel(&bob, NS, "job");
    let unknown = s.dispatcher.cancel(&bob, NS, "no-such-job");
    assert!(matches!(bobs_cancel, Err(CancelError::NotFound { .. })));
    assert_eq!(
        bobs_cancel.map_err(|e| e.to_string().replace("job", "ID")),
        unknown.map_err(|e| e.to_string().replace("no-such-job", "ID")),
        "the same answer as an id nobody uses"
    );
    let b1 = spawn_as(
        &s,
        bob.clone(),
        with_id(request("b", Duration::from_secs(30)), "job"),
    );
    s.parked(2).await;
    assert!(!a1.is_finished() && !b1.is_finished());

    // Control: the id is still Alice's own, so her duplicate is refused and her cancel works.
    let dup = s
        .dispatcher
        .dispatch(
            &alice,
            with_id(request("a", Duration::from_secs(30)), "job"),
        )
        .await;
    assert!(matches!(
        dup,
        Err(DispatchError::DuplicateActivityId { .. })
    ));
    s.dispatcher.cancel(&alice, NS, "job").expect("her own");
    assert_eq!(a1.await.expect("joined"), Ok(ActivityOutcome::Cancelled));
    assert!(
        !b1.is_finished(),
        "Alice's cancel did not reach Bob's dispatch"
    );

    // An operator of the namespace reaches every principal's dispatch with the id.
    s.dispatcher.cancel(&operator, NS, "job").expect("operator");
    assert_eq!(b1.await.expect("joined"), Ok(ActivityOutcome::Cancelled));
}
