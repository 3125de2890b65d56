//! Sessions in the registry: suspension on a lost connection, resume, refusals, grace expiry,
//! a superseded connection, and the prober leaving suspended workers to their grace.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use crate::address::WorkerId;
use crate::delivery::WorkerMessage;
use crate::eligibility::Eligibility;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::liveness::{Liveness, LivenessConfig};
use crate::registration::{CallerIdentity, Registration};
use crate::registry::Registry;
use crate::registry::testing::{Admitted, TestLeg, admit, hold, pick, registration};
use crate::session::{MAX_RESUME_TASKS, ResumeRefused, ResumeRequest, SessionGrant};
use crate::{RESUME_SECRET_BYTES, TaskId};

const GRACE: Duration = Duration::from_secs(5);

/// A resumable registration on the default test leg's pool (`ns`, default queue, `a`).
fn resumable(grace: Duration) -> Registration {
    Registration {
        reconnect_grace: grace,
        ..registration(&["ns"], "", "", &["a"])
    }
}

fn tester() -> CallerIdentity {
    CallerIdentity::trusted("tester")
}

fn events_so_far(events: &mut broadcast::Receiver<WorkerEvent>) -> Vec<WorkerEvent> {
    std::iter::from_fn(|| events.try_recv().ok())
        .take(64)
        .collect()
}

fn standing(registry: &Registry, worker: WorkerId) -> Option<Eligibility> {
    registry.worker(worker).map(|snapshot| snapshot.eligibility)
}

fn suspended_for(registry: &Registry, worker: WorkerId) -> Option<Duration> {
    registry
        .worker(worker)
        .and_then(|snapshot| snapshot.suspended_for)
}

/// The request that resumes `grant`'s session, listing no task.
fn request(grant: &SessionGrant) -> ResumeRequest {
    ResumeRequest {
        session_id: grant.session_id,
        secret: grant.secret.as_bytes().to_vec(),
        running: Vec::new(),
        unacked: Vec::new(),
    }
}

/// Runs the registry's half of a resume on a fresh leg (the dispatcher's half has nothing to
/// square here: no task is pending).
fn reattach(
    registry: &Registry,
    caller: &CallerIdentity,
    request: &ResumeRequest,
) -> Result<Admitted, ResumeRefused> {
    let (leg, rx) = TestLeg::new();
    let reattached = registry.inner.reattach(caller, request, leg.clone())?;
    Ok(Admitted {
        token: reattached.token,
        leg,
        rx,
    })
}

/// Admits a resumable worker and drops its token: the worker is suspended. The old leg's far
/// end stays with the test, so the leg still reads as connected.
fn suspended(registry: &Registry) -> (WorkerId, SessionGrant, mpsc::Receiver<WorkerMessage>) {
    let worker = admit(registry, resumable(GRACE));
    let grant = worker
        .token
        .session()
        .cloned()
        .expect("a resumable registration with a grace has a session");
    let id = worker.id();
    drop(worker.token);
    (id, grant, worker.rx)
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_suspends_a_session_worker_keeping_its_slots() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit(&registry, resumable(GRACE));
    let id = worker.id();
    assert_eq!(
        worker
            .token
            .session()
            .map(|grant| (grant.session_id, grant.grace)),
        Some((id, GRACE)),
        "the session id is the worker id"
    );
    let slot = hold(&registry, "ns", "", "a").expect("the worker takes a task");
    events_so_far(&mut events);

    drop(worker.token);

    assert!(registry.is_registered(id), "suspended, not gone");
    assert_eq!(standing(&registry, id), Some(Eligibility::Suspended));
    assert_eq!(suspended_for(&registry, id), Some(GRACE));
    assert_eq!(
        registry.worker(id).map(|w| w.in_flight),
        Some(1),
        "slot kept"
    );
    assert_eq!(pick(&registry, "ns", "", "a", None), None, "not eligible");
    assert_eq!(
        events_so_far(&mut events),
        vec![WorkerEvent::Suspended {
            worker: id,
            grace: GRACE
        }]
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        suspended_for(&registry, id),
        Some(Duration::from_secs(3)),
        "the time left counts down"
    );
    drop(slot);
    assert_eq!(registry.worker(id).map(|w| w.in_flight), Some(0));

    // Control: without a session the same drop deregisters at once.
    let plain = admit(&registry, resumable(Duration::ZERO));
    let plain_id = plain.id();
    assert!(plain.token.session().is_none(), "grace 0 means no session");
    drop(plain.token);
    assert!(!registry.is_registered(plain_id));
    assert!(
        events_so_far(&mut events).contains(&WorkerEvent::Disconnected {
            worker: plain_id,
            reason: DisconnectReason::Disconnect
        })
    );
}

#[tokio::test(start_paused = true)]
async fn the_grace_ending_without_a_resume_deregisters_as_reconnect_grace_expired() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let (id, _grant, _old) = suspended(&registry);
    events_so_far(&mut events);

    tokio::time::sleep(GRACE - Duration::from_millis(1)).await;
    assert!(
        registry.is_registered(id),
        "control: still suspended just before the end"
    );
    tokio::time::sleep(Duration::from_millis(2)).await;

    assert!(!registry.is_registered(id));
    assert_eq!(
        events_so_far(&mut events),
        vec![WorkerEvent::Disconnected {
            worker: id,
            reason: DisconnectReason::ReconnectGraceExpired
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn the_right_secret_resumes_the_same_worker_on_its_new_connection() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let (id, grant, mut old_rx) = suspended(&registry);
    events_so_far(&mut events);
    tokio::time::advance(Duration::from_secs(1)).await;

    let mut resumed = reattach(&registry, &tester(), &request(&grant)).expect("resumed");

    assert_eq!(resumed.id(), id, "same worker id");
    assert_eq!(resumed.token.session(), Some(&grant), "same session");
    assert_eq!(suspended_for(&registry, id), None);
    assert_eq!(
        pick(&registry, "ns", "", "a", None),
        None,
        "not dispatched to before the transport announces it"
    );
    assert!(
        events_so_far(&mut events).is_empty(),
        "nothing before the announcement"
    );

    assert!(resumed.token.announce());
    assert_eq!(
        events_so_far(&mut events),
        vec![WorkerEvent::Resumed { worker: id }]
    );
    assert_eq!(standing(&registry, id), Some(Eligibility::Eligible));
    assert_eq!(pick(&registry, "ns", "", "a", None), Some(id));
    assert!(registry.drain_worker(id));
    assert_eq!(
        resumed.rx.try_recv().ok(),
        Some(WorkerMessage::Drain),
        "new leg"
    );
    assert!(old_rx.try_recv().is_err(), "nothing on the old leg");

    // The first suspension's timer passes: it no longer concerns the resumed worker.
    tokio::time::sleep(GRACE * 2).await;
    assert!(registry.is_registered(id));
}

#[tokio::test(start_paused = true)]
async fn refused_resumes_are_named_and_change_nothing() {
    let registry = Registry::default();
    let (id, grant, _old) = suspended(&registry);
    let mut events = registry.subscribe_events();
    tokio::time::advance(Duration::from_secs(1)).await;

    let mut wrong_secret = request(&grant);
    wrong_secret.secret[0] ^= 1;
    let mut short_secret = request(&grant);
    short_secret.secret.truncate(RESUME_SECRET_BYTES - 1);
    let mut unknown = request(&grant);
    unknown.session_id = WorkerId::from_raw(u64::MAX);
    let mut too_many = request(&grant);
    too_many.unacked = vec![TaskId::from_raw(1); MAX_RESUME_TASKS + 1];
    let cases = [
        (tester(), wrong_secret, "wrong_secret"),
        (tester(), short_secret, "wrong_secret"),
        (
            CallerIdentity::trusted("intruder"),
            request(&grant),
            "wrong_principal",
        ),
        (tester(), unknown, "unknown_session"),
        (tester(), too_many, "too_many_tasks"),
    ];
    for (caller, request, label) in cases {
        let refusal = reattach(&registry, &caller, &request).expect_err(label);
        assert_eq!(refusal.label(), label);
        assert!(
            refusal
                .to_string()
                .starts_with(&format!("resume refused: {label}")),
            "{refusal}"
        );
        assert_eq!(
            standing(&registry, id),
            Some(Eligibility::Suspended),
            "{label}"
        );
        assert_eq!(
            suspended_for(&registry, id),
            Some(GRACE - Duration::from_secs(1))
        );
    }
    assert!(
        events_so_far(&mut events).is_empty(),
        "a refusal emits nothing"
    );

    // Nothing was reset: the worker expires on its first grace.
    tokio::time::sleep(GRACE - Duration::from_secs(1) + Duration::from_millis(1)).await;
    assert!(!registry.is_registered(id));
    assert_eq!(
        events_so_far(&mut events),
        vec![WorkerEvent::Disconnected {
            worker: id,
            reason: DisconnectReason::ReconnectGraceExpired
        }]
    );
    // Control: the right request, refused now only because the session has ended.
    assert_eq!(
        reattach(&registry, &tester(), &request(&grant)).map(|a| a.id()),
        Err(ResumeRefused::UnknownSession { session_id: id })
    );
}

#[tokio::test(start_paused = true)]
async fn a_draining_or_closing_registry_refuses_a_resume_and_keeps_the_old_connection() {
    let registry = Registry::default();
    let draining = admit(&registry, resumable(GRACE));
    let grant = draining.token.session().cloned().expect("session");
    assert!(registry.drain_worker(draining.id()));

    assert_eq!(
        reattach(&registry, &tester(), &request(&grant)).map(|a| a.id()),
        Err(ResumeRefused::Draining {
            session_id: grant.session_id
        })
    );
    assert_eq!(draining.token.departure().reason(), None, "not superseded");
    assert_eq!(
        standing(&registry, draining.id()),
        Some(Eligibility::Draining)
    );

    let open = admit(&registry, resumable(GRACE));
    let open_grant = open.token.session().cloned().expect("session");
    registry.broadcast_shutdown();
    assert_eq!(
        reattach(&registry, &tester(), &request(&open_grant)).map(|a| a.id()),
        Err(ResumeRefused::ShuttingDown)
    );
    assert_eq!(open.token.departure().reason(), None, "not superseded");
}

#[tokio::test(start_paused = true)]
async fn a_resume_while_connected_supersedes_the_old_connection_whose_token_then_does_nothing() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let old = admit(&registry, resumable(GRACE));
    let id = old.id();
    let grant = old.token.session().cloned().expect("session");
    let old_departure = old.token.departure();
    events_so_far(&mut events);

    let resumed = reattach(&registry, &tester(), &request(&grant)).expect("resumed");

    assert_eq!(old_departure.reason(), Some(DisconnectReason::Superseded));
    assert_eq!(resumed.token.departure().reason(), None);
    drop(old.token);
    assert!(
        registry.is_registered(id),
        "the old token's drop does nothing"
    );
    assert_eq!(suspended_for(&registry, id), None, "and suspends nothing");
    assert!(resumed.token.announce());
    assert_eq!(
        events_so_far(&mut events),
        vec![WorkerEvent::Resumed { worker: id }],
        "no Suspended, no Disconnected: only the resume"
    );
    assert_eq!(standing(&registry, id), Some(Eligibility::Eligible));

    // Control: the new connection's token does suspend the worker.
    drop(resumed.token);
    assert_eq!(standing(&registry, id), Some(Eligibility::Suspended));
}

#[tokio::test(start_paused = true)]
async fn a_drained_or_failed_connection_deregisters_without_a_suspension() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let drained = admit(&registry, resumable(GRACE));
    let drained_id = drained.id();
    assert!(registry.drain_worker(drained_id));
    drop(drained.token);
    assert!(
        !registry.is_registered(drained_id),
        "a drained worker's lost connection"
    );

    let failed = admit(&registry, resumable(GRACE));
    let failed_id = failed.id();
    assert!(failed.token.deregister(DisconnectReason::Unresponsive));
    assert!(!registry.is_registered(failed_id), "a named deregistration");

    let disconnections: Vec<WorkerEvent> = events_so_far(&mut events)
        .into_iter()
        .filter(|event| {
            !matches!(
                event,
                WorkerEvent::Connected { .. } | WorkerEvent::CapacityAnnounced { .. }
            )
        })
        .collect();
    assert_eq!(
        disconnections,
        vec![
            WorkerEvent::Disconnected {
                worker: drained_id,
                reason: DisconnectReason::Disconnect
            },
            WorkerEvent::Disconnected {
                worker: failed_id,
                reason: DisconnectReason::Unresponsive
            },
        ]
    );
    // Control: the same worker, not drained, is suspended.
    let kept = admit(&registry, resumable(GRACE));
    let kept_id = kept.id();
    drop(kept.token);
    assert_eq!(standing(&registry, kept_id), Some(Eligibility::Suspended));
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_registration_was_never_acknowledged_is_not_suspended() {
    let registry = Registry::default();
    let (leg, _rx) = TestLeg::new();
    let token = registry
        .admit_unannounced(&tester(), resumable(GRACE), leg)
        .await
        .expect("admitted");
    let id = token.worker_id();
    drop(token);
    assert!(
        !registry.is_registered(id),
        "it never learnt its secret, so nobody can resume it"
    );
    // Control: once announced, the same loss suspends.
    let (leg, _rx) = TestLeg::new();
    let token = registry
        .admit_unannounced(&tester(), resumable(GRACE), leg)
        .await
        .expect("admitted");
    let id = token.worker_id();
    assert!(token.announce());
    drop(token);
    assert_eq!(standing(&registry, id), Some(Eligibility::Suspended));
}

#[tokio::test(start_paused = true)]
async fn the_prober_leaves_a_suspended_worker_to_its_grace() {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    let prober = liveness.spawn();
    let grace = Duration::from_secs(60);
    let mut away = admit_on_fresh_leg(&registry, resumable(grace));
    // Without a session: silence is a departure (a session worker's silence suspends it).
    let mut silent = admit_on_fresh_leg(&registry, resumable(Duration::ZERO));
    for worker in [&mut away, &mut silent] {
        for _ in 0..2 {
            let seq = next_ping(worker).await;
            liveness.record_pong(worker.id(), seq);
        }
        assert_eq!(
            standing(&registry, worker.id()),
            Some(Eligibility::Eligible)
        );
    }
    let mut events = registry.subscribe_events();
    let away_id = away.id();
    drop(away.token);

    // Past the heartbeat window (30 s) with neither worker saying anything.
    tokio::time::sleep(Duration::from_secs(40)).await;

    assert!(
        !registry.is_registered(silent.id()),
        "control: a connected silent worker without a session is timed out"
    );
    assert_eq!(standing(&registry, away_id), Some(Eligibility::Suspended));
    tokio::time::sleep(grace).await;
    let reasons: Vec<(WorkerId, DisconnectReason)> = events_so_far(&mut events)
        .into_iter()
        .filter_map(|event| match event {
            WorkerEvent::Disconnected { worker, reason } => Some((worker, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            (silent.id(), DisconnectReason::Timeout),
            (away_id, DisconnectReason::ReconnectGraceExpired)
        ]
    );
    prober.abort();
}

/// Admits on a leg with room for a minute of pings.
fn admit_on_fresh_leg(registry: &Registry, registration: Registration) -> Admitted {
    crate::registry::testing::admit_on(registry, registration, TestLeg::new())
}

async fn next_ping(worker: &mut Admitted) -> u64 {
    loop {
        match worker.rx.recv().await {
            Some(WorkerMessage::Ping { seq }) => return seq,
            Some(_) => {}
            None => panic!("link closed"),
        }
    }
}

#[test]
fn the_leg_is_shared_so_a_resume_reaches_pending_holders() {
    // A pending task keeps the worker's delivery; after a resume it must reach the new
    // connection, which only works if admission handed out core's session leg.
    let registry = Registry::default();
    let worker = admit(&registry, resumable(GRACE));
    let held = registry.worker(worker.id()).expect("registered").worker;
    let grant = worker.token.session().cloned().expect("session");
    let (leg, mut rx) = TestLeg::new();
    let reattached = registry
        .inner
        .reattach(
            &tester(),
            &request(&grant),
            leg as Arc<dyn crate::WorkerDelivery>,
        )
        .expect("resumed");
    assert!(reattached.token.announce());
    held.delivery()
        .deliver(WorkerMessage::Ping { seq: 7 })
        .expect("delivered");
    assert_eq!(rx.try_recv().ok(), Some(WorkerMessage::Ping { seq: 7 }));
    drop(reattached);
}

#[tokio::test(start_paused = true)]
async fn a_resume_over_a_silent_connection_counts_as_life_and_proves_the_worker_afresh() {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    let prober = liveness.spawn();
    let mut worker = admit_on_fresh_leg(&registry, resumable(GRACE));
    // Without a session, so its silence ends it (a session worker's would suspend it).
    let mut stays_silent = admit_on_fresh_leg(&registry, resumable(Duration::ZERO));
    for admitted in [&mut worker, &mut stays_silent] {
        for _ in 0..2 {
            let seq = next_ping(admitted).await;
            liveness.record_pong(admitted.id(), seq);
        }
    }
    let id = worker.id();
    let grant = worker.token.session().cloned().expect("session");

    // Its connection goes half-open: pings unanswered until the worker gives up on it and
    // resumes on a new one, just before the heartbeat window (30 s) runs out.
    tokio::time::sleep(Duration::from_millis(29_500)).await;
    assert_eq!(standing(&registry, id), Some(Eligibility::Unreachable));
    let mut resumed = reattach(&registry, &tester(), &request(&grant)).expect("resumed");
    assert!(resumed.token.announce());
    for _ in 0..2 {
        let seq = tokio::time::timeout(Duration::from_millis(100), next_ping(&mut resumed))
            .await
            .expect("probation pings go out on the new connection at once");
        liveness.record_pong(id, seq);
    }
    assert_eq!(standing(&registry, id), Some(Eligibility::Eligible));

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(registry.is_registered(id), "the resume was a sign of life");
    assert!(
        !registry.is_registered(stays_silent.id()),
        "control: the worker that stayed silent is timed out"
    );
    drop(worker.token);
    prober.abort();
}

#[tokio::test(start_paused = true)]
async fn nothing_reaches_a_resumed_connection_before_its_announcement() {
    let registry = Registry::builder().opening_probation(true).build();
    let liveness = Liveness::new(registry.clone(), LivenessConfig::default());
    let prober = liveness.spawn();
    let mut worker = admit_on_fresh_leg(&registry, resumable(GRACE));
    for _ in 0..2 {
        let seq = next_ping(&mut worker).await;
        liveness.record_pong(worker.id(), seq);
    }
    let grant = worker.token.session().cloned().expect("session");
    let mut resumed = reattach(&registry, &tester(), &request(&grant)).expect("resumed");

    // A ping round passes while the transport is still writing its acknowledgement.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        resumed.rx.try_recv().is_err(),
        "nothing reaches the new connection before its acknowledgement"
    );
    // Control: once announced, the prober pings it.
    assert!(resumed.token.announce());
    next_ping(&mut resumed).await;
    drop(worker.token);
    prober.abort();
}
