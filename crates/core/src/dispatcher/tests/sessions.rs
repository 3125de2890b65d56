//! Dispatches held by a session worker across a lost connection: they wait while it is
//! suspended, its result after a resume completes them once, unreached tasks go out again as a
//! new attempt, grace expiry moves them, and a dispatch that ended meanwhile is cancelled after
//! the resume and its late result refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::dispatcher::*;
use crate::eligibility::Eligibility;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::session::{ResumeRefused, ResumeRequest, SessionGrant};

use super::fixture::*;

const GRACE: Duration = Duration::from_secs(5);

fn leg() -> (Arc<Leg>, mpsc::Receiver<WorkerMessage>) {
    let (tx, rx) = mpsc::channel(256);
    let leg = Arc::new(Leg {
        tx,
        connected: AtomicBool::new(true),
        refuse_tasks: AtomicU32::new(0),
        frame_limit: AtomicUsize::new(usize::MAX),
    });
    (leg, rx)
}

/// A resumable worker of `capacity` slots with a reconnect grace of `grace`, and its session.
async fn session_worker(s: &Setup, capacity: u32, grace: Duration) -> (TestWorker, SessionGrant) {
    let (leg, rx) = leg();
    let registration = crate::Registration {
        reconnect_grace: grace,
        ..registration(capacity)
    };
    let token = s
        .registry
        .admit(&caller(), registration, Arc::clone(&leg) as _)
        .await
        .expect("a valid registration is admitted");
    let grant = token.session().cloned().expect("a session");
    let worker = TestWorker {
        id: token.worker_id(),
        token: Some(token),
        rx,
        leg,
    };
    (worker, grant)
}

/// What `Core::resume` does, on the fixture's registry and dispatcher: reattaches `worker` on a
/// fresh leg (which the worker then reads), squares its held tasks with `running` and
/// `unacked`, and queues the cancels for the announcement. Returns the held tasks; the caller
/// announces.
fn resume(
    s: &Setup,
    worker: &mut TestWorker,
    grant: &SessionGrant,
    running: &[TaskId],
    unacked: &[TaskId],
) -> Result<Vec<TaskId>, ResumeRefused> {
    let (leg, rx) = leg();
    let request = ResumeRequest {
        session_id: grant.session_id,
        secret: grant.secret.as_bytes().to_vec(),
        running: running.to_vec(),
        unacked: unacked.to_vec(),
    };
    let inner = &s.registry.inner;
    let reattached = inner.reattach(&caller(), &request, Arc::clone(&leg) as _)?;
    let (held, cancels) = s.dispatcher.reconcile_resumed(worker.id, running, unacked);
    inner.queue_after_resume(
        worker.id,
        cancels
            .into_iter()
            .map(|(task_id, reason)| WorkerMessage::Cancel { task_id, reason })
            .collect(),
    );
    worker.token = Some(reattached.token);
    worker.rx = rx;
    worker.leg = leg;
    Ok(held)
}

fn announce(worker: &TestWorker) {
    assert!(
        worker.token.as_ref().is_some_and(|token| token.announce()),
        "announced"
    );
}

#[tokio::test(start_paused = true)]
async fn a_suspended_workers_dispatch_waits_and_its_result_after_resume_completes_it_once() {
    let s = setup();
    let (mut away, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("held", Duration::from_secs(60)));
    let task = away.task().await;
    let mut other = s.worker(1).await;

    away.leave();
    assert_eq!(s.eligibility(&away), Eligibility::Suspended);
    assert_eq!(s.in_flight(&away), 1, "the slot stays taken");
    tokio::time::sleep(GRACE - Duration::from_secs(1)).await;
    assert!(!running.is_finished(), "the dispatch keeps waiting");
    assert!(
        other.sent().is_empty(),
        "and is not handed to another worker"
    );

    let held = resume(&s, &mut away, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(held, vec![task.task_id]);
    announce(&away);
    assert!(away.sent().is_empty(), "a held task is not sent again");
    assert_eq!(s.in_flight(&away), 1);
    assert_eq!(
        s.dispatcher
            .complete(away.id, task.task_id, success("held")),
        Ok(())
    );
    assert_eq!(running.await.expect("joined"), completed("held"));
    assert_eq!(
        s.dispatcher
            .complete(away.id, task.task_id, success("held")),
        Err(CompletionRefused::UnknownTask { task: task.task_id }),
        "applied once"
    );
    assert_eq!(s.in_flight(&away), 0);

    // Control: a worker without a session loses its dispatch to another worker at once.
    let s = setup();
    let mut plain = s.worker(1).await;
    let running = s.spawn(request("moved", Duration::from_secs(60)));
    let first = plain.task().await;
    let mut other = s.worker(1).await;
    plain.leave();
    let again = other.task().await;
    assert_eq!((again.input, again.attempt), (first.input, 2));
    s.dispatcher
        .complete(other.id, again.task_id, success("moved"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("moved"));
}

#[tokio::test(start_paused = true)]
async fn a_task_the_resumed_worker_never_got_goes_out_again_without_charging_the_loss_budget() {
    // With a budget of 0, any transport loss would end the dispatch.
    let s = setup_with(DispatchConfig {
        loss_budget: 0,
        ..DispatchConfig::default()
    });
    let (mut away, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("lost in the break", Duration::from_secs(60)));
    let first = away.task().await;
    away.leave();

    let held = resume(&s, &mut away, &grant, &[], &[]).expect("resumed");
    assert!(held.is_empty(), "the worker reported nothing");
    assert_eq!(s.in_flight(&away), 0, "its slot is freed");
    announce(&away);
    let again = away.task().await;
    assert_eq!(again.attempt, 2, "a new attempt");
    assert_ne!(again.task_id, first.task_id);
    assert_eq!(again.input, first.input);
    s.dispatcher
        .complete(away.id, again.task_id, success("lost in the break"))
        .expect("accepted");
    assert_eq!(
        running.await.expect("joined"),
        completed("lost in the break")
    );
    assert_eq!(
        s.dispatcher
            .complete(away.id, first.task_id, success("lost in the break")),
        Err(CompletionRefused::UnknownTask {
            task: first.task_id
        }),
        "the first attempt is let go"
    );

    // Control: with this budget a real loss (the grace running out) ends the dispatch.
    let running = s.spawn(request("expired", Duration::from_secs(60)));
    away.task().await;
    away.leave();
    tokio::time::sleep(GRACE + Duration::from_millis(1)).await;
    assert_eq!(
        running.await.expect("joined"),
        ActivityOutcome::TransportLost {
            transport: crate::delivery::TransportName::from_static("test"),
            attempts: 1
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_grace_running_out_moves_the_task_to_another_worker() {
    let s = setup();
    let (mut away, _grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("moves", Duration::from_secs(60)));
    let first = away.task().await;
    let mut other = s.worker(1).await;
    let mut events = s.registry.subscribe_events();
    away.leave();

    tokio::time::sleep(GRACE - Duration::from_millis(1)).await;
    assert!(
        other.sent().is_empty(),
        "control: nothing moves during the grace"
    );
    let again = other.task().await;
    assert_eq!((again.input.clone(), again.attempt), (first.input, 2));
    s.dispatcher
        .complete(other.id, again.task_id, success("moves"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("moves"));
    let departures: Vec<WorkerEvent> = std::iter::from_fn(|| events.try_recv().ok())
        .filter(|event| matches!(event, WorkerEvent::Disconnected { .. }))
        .collect();
    assert_eq!(
        departures,
        vec![WorkerEvent::Disconnected {
            worker: away.id,
            reason: DisconnectReason::ReconnectGraceExpired
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_passing_while_suspended_ends_timed_out_and_the_late_result_is_refused() {
    let s = setup();
    let (mut away, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("slow", Duration::from_secs(2)));
    let task = away.task().await;
    away.leave();

    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        s.in_flight(&away),
        1,
        "the slot stays with the suspended worker"
    );
    let held = resume(&s, &mut away, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(
        held,
        vec![task.task_id],
        "held, so the worker hears the cancel"
    );
    assert!(away.sent().is_empty(), "nothing before the announcement");
    announce(&away);
    assert_eq!(
        away.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }],
        "the cancel follows the announcement"
    );
    assert_eq!(
        s.dispatcher
            .complete(away.id, task.task_id, success("slow")),
        Err(CompletionRefused::Late { task: task.task_id })
    );
    assert_eq!(s.dispatcher.refused().late, 1);
    assert_eq!(s.in_flight(&away), 0, "the late result frees the slot");

    // Control: a dispatch ending while its worker is connected takes the result as the cancel
    // acknowledgement, not as late.
    let running = s.spawn(request("slow too", Duration::from_secs(2)));
    let task = away.task().await;
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);
    assert_eq!(
        s.dispatcher
            .complete(away.id, task.task_id, success("slow too")),
        Ok(())
    );
    assert_eq!(s.dispatcher.results_after_cancel(), 1);
    assert_eq!(s.dispatcher.refused().late, 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_suspended_reaches_the_worker_after_its_resume() {
    let s = setup();
    let (mut away, grant) = session_worker(&s, 2, GRACE).await;
    let cancelled = s.spawn(with_id(request("stop", Duration::from_secs(60)), "job"));
    let stopped = away.task().await;
    let kept = s.spawn(request("keep", Duration::from_secs(60)));
    let going = away.task().await;
    away.leave();

    s.dispatcher
        .cancel(&caller(), NS, "job")
        .expect("in flight");
    assert_eq!(cancelled.await.expect("joined"), ActivityOutcome::Cancelled);
    let held = resume(
        &s,
        &mut away,
        &grant,
        &[stopped.task_id, going.task_id],
        &[],
    )
    .expect("resumed");
    assert_eq!(held.len(), 2);
    announce(&away);
    assert_eq!(
        away.sent(),
        vec![WorkerMessage::Cancel {
            task_id: stopped.task_id,
            reason: CancelReason::Requested
        }],
        "only the cancelled task is told to stop"
    );
    assert_eq!(
        s.dispatcher.cancel_acknowledged(away.id, stopped.task_id),
        Ok(())
    );
    s.dispatcher
        .complete(away.id, going.task_id, success("keep"))
        .expect("accepted");
    assert_eq!(kept.await.expect("joined"), completed("keep"));
    assert_eq!(s.in_flight(&away), 0);
}

#[tokio::test(start_paused = true)]
async fn a_suspended_worker_is_not_charged_for_cancels_it_could_not_hear() {
    let config = DispatchConfig {
        cancel_ack_timeout: Duration::from_secs(10),
        max_unresponsive_tasks: 1,
        ..DispatchConfig::default()
    };
    let s = setup_with(config);
    let grace = Duration::from_secs(60);
    let (mut away, grant) = session_worker(&s, 1, grace).await;
    let running = s.spawn(request("slow", Duration::from_secs(1)));
    let task = away.task().await;
    away.leave();
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);

    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(s.registry.is_registered(away.id), "still within its grace");
    assert_eq!(s.eligibility(&away), Eligibility::Suspended);
    assert_eq!(
        s.registry
            .worker(away.id)
            .map(|w| (w.unresponsive, w.in_flight)),
        Some((0, 1)),
        "not unresponsive: the cancel never reached it; the slot stays its"
    );

    let held = resume(&s, &mut away, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(held, vec![task.task_id]);
    announce(&away);
    assert!(matches!(
        away.sent().as_slice(),
        [WorkerMessage::Cancel { .. }]
    ));
    // Control: once it has heard the cancel, the worker has the ack timeout to answer.
    tokio::time::sleep(Duration::from_secs(10) + Duration::from_millis(1)).await;
    assert!(
        !s.registry.is_registered(away.id),
        "unanswered after the resume: unresponsive"
    );
}

#[tokio::test(start_paused = true)]
async fn a_resume_over_a_live_connection_keeps_the_held_task() {
    let s = setup();
    let (mut worker, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("kept", Duration::from_secs(60)));
    let task = worker.task().await;
    let old_token = worker.token.take().expect("token");
    let old_departure = old_token.departure();

    let held = resume(&s, &mut worker, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(held, vec![task.task_id]);
    assert_eq!(old_departure.reason(), Some(DisconnectReason::Superseded));
    drop(old_token);
    assert!(
        !running.is_finished(),
        "the old connection closing loses nothing"
    );
    assert_eq!(s.in_flight(&worker), 1);
    announce(&worker);
    s.dispatcher
        .complete(worker.id, task.task_id, success("kept"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("kept"));
}

#[tokio::test(start_paused = true)]
async fn a_resume_lost_before_its_announcement_leaves_one_cancel_for_the_next() {
    let s = setup();
    let (mut away, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("slow", Duration::from_secs(1)));
    let task = away.task().await;
    away.leave();
    assert_eq!(running.await.expect("joined"), ActivityOutcome::TimedOut);

    let held = resume(&s, &mut away, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(held, vec![task.task_id]);
    away.leave();
    assert_eq!(
        s.eligibility(&away),
        Eligibility::Suspended,
        "a resumed connection lost before its acknowledgement suspends again"
    );
    let held = resume(&s, &mut away, &grant, &[task.task_id], &[]).expect("resumed again");
    assert_eq!(held, vec![task.task_id]);
    announce(&away);
    assert_eq!(
        away.sent(),
        vec![WorkerMessage::Cancel {
            task_id: task.task_id,
            reason: CancelReason::DeadlineExceeded
        }],
        "one cancel, not one per resume"
    );
}

/// The liveness prober's verdict on a session worker (silent for its whole window) suspends it
/// like a lost connection: its transport is told to close (`DEREGISTERED`, "deregistered by the
/// gateway: timeout", on QUIC), but the session, its slot and its task stay, so it resumes.
#[tokio::test(start_paused = true)]
async fn a_session_worker_found_silent_is_suspended_and_resumes_with_its_task() {
    let s = setup();
    let (mut quiet, grant) = session_worker(&s, 1, GRACE).await;
    let running = s.spawn(request("held", Duration::from_secs(60)));
    let task = quiet.task().await;
    let mut events = s.registry.subscribe_events();

    // What the prober calls once the worker missed its window.
    assert!(s.registry.deregister(quiet.id, DisconnectReason::Timeout));
    assert_eq!(s.eligibility(&quiet), Eligibility::Suspended);
    assert_eq!(s.in_flight(&quiet), 1, "the slot stays taken");
    let seen: Vec<WorkerEvent> = std::iter::from_fn(|| events.try_recv().ok()).collect();
    assert!(
        seen.iter().any(
            |event| matches!(event, WorkerEvent::Suspended { worker, .. } if *worker == quiet.id)
        ),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|event| matches!(event, WorkerEvent::Disconnected { .. })),
        "{seen:?}"
    );

    let held = resume(&s, &mut quiet, &grant, &[task.task_id], &[]).expect("resumed");
    assert_eq!(held, vec![task.task_id]);
    announce(&quiet);
    s.dispatcher
        .complete(quiet.id, task.task_id, success("held"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("held"));

    // Control: a worker without a session found silent leaves.
    let plain = s.worker(1).await;
    let mut events = s.registry.subscribe_events();
    assert!(s.registry.deregister(plain.id, DisconnectReason::Timeout));
    assert!(!s.registry.is_registered(plain.id));
    assert_eq!(
        events.try_recv().ok(),
        Some(WorkerEvent::Disconnected {
            worker: plain.id,
            reason: DisconnectReason::Timeout
        })
    );
}
