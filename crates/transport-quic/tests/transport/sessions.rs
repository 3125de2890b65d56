//! Sessions on the wire, spoken by hand as a worker in another language would: the grant in
//! `registered`, suspension on a lost connection, `resume` with its held tasks and refusals,
//! the superseded old connection, and `results_ack`.

use std::time::Duration;

use bytes::Bytes;
use switchyard_auth::AllowAll;
use switchyard_core::{ActivityOutcome, DisconnectReason, WorkerEvent, WorkerId};
use switchyard_proto::v1::{
    QuicRegistered, QuicResult, QuicResume, quic_control_down, quic_control_up, quic_lane_up,
    quic_result,
};
use switchyard_test_support::UdpRelay;
use switchyard_transport_quic::{ConnectionConfig, ErrorCode, QuicServerConfig};

use crate::support::{
    Gateway, PATIENCE, Raw, client_config, event, eventually, outcome_of, register_frame,
};

/// A gateway that notices a dead link within half a second: the QUIC idle timeout ends the
/// connection, not the liveness window.
async fn gateway() -> Gateway {
    let config = QuicServerConfig {
        connection: ConnectionConfig {
            max_idle_timeout: Duration::from_millis(500),
            keep_alive_interval: Some(Duration::from_millis(100)),
            ..ConnectionConfig::default()
        },
        ..QuicServerConfig::default()
    };
    Gateway::with(config, AllowAll).await
}

/// Registers a resumable worker for `work` with capacity 1 over `addr`, once it is eligible.
async fn resumable(gateway: &Gateway, addr: std::net::SocketAddr) -> (Raw, QuicRegistered) {
    eligible(gateway, addr, true).await
}

/// Registers a worker for `work` with capacity 1 over `addr`, resumable or not, once it is
/// eligible.
async fn eligible(
    gateway: &Gateway,
    addr: std::net::SocketAddr,
    resumable: bool,
) -> (Raw, QuicRegistered) {
    eligible_with(gateway, addr, resumable, client_config(gateway)).await
}

/// [`eligible`], dialing with `config`.
async fn eligible_with(
    gateway: &Gateway,
    addr: std::net::SocketAddr,
    resumable: bool,
    config: quinn::ClientConfig,
) -> (Raw, QuicRegistered) {
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::dial(addr, "127.0.0.1:0", config, None).await;
    let registered = raw
        .register(switchyard_proto::v1::QuicRegister {
            resumable,
            ..register_frame(&["work"])
        })
        .await;
    raw.announce(1).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    // Probation and the announcement end in either order.
    let (mut probation, mut announced) = (false, false);
    while !(probation && announced) {
        let seen = event(&mut events, "eligible", |e| {
            matches!(e, WorkerEvent::ProbationPassed { worker: w }
                | WorkerEvent::CapacityAnnounced { worker: w, .. } if *w == worker)
        })
        .await;
        match seen {
            WorkerEvent::ProbationPassed { .. } => probation = true,
            _ => announced = true,
        }
    }
    (raw, registered)
}

/// Whether `worker` is suspended; `None` while it is not registered at all.
fn suspended(gateway: &Gateway, worker: WorkerId) -> Option<bool> {
    gateway
        .registry()
        .worker(worker)
        .map(|w| w.suspended_for.is_some())
}

fn resume_frame(registered: &QuicRegistered, secret: Bytes, running: Vec<u64>) -> QuicResume {
    QuicResume {
        protocol_version: 1,
        auth_token: String::new(),
        session_id: registered.session_id,
        resume_secret: secret,
        running_task_ids: running,
        unacked_task_ids: Vec::new(),
        redundancy: 0,
    }
}

/// Dispatches `input` to the `work` pool through core, as a producer would; the handle yields
/// the outcome.
fn dispatch(
    gateway: &Gateway,
    input: &'static [u8],
    timeout: Duration,
) -> tokio::task::JoinHandle<ActivityOutcome> {
    let core = gateway.core.clone();
    tokio::spawn(async move {
        core.dispatcher()
            .dispatch(
                &switchyard_core::CallerIdentity::trusted("test"),
                crate::support::request("work", input, timeout),
            )
            .await
            .unwrap()
    })
}

fn output(task_id: u64, text: &'static str) -> quic_lane_up::Frame {
    quic_lane_up::Frame::Result(QuicResult {
        task_id,
        outcome: Some(quic_result::Outcome::Output(Bytes::from_static(
            text.as_bytes(),
        ))),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumable_registration_gets_a_session_and_a_plain_one_does_not() {
    let gateway = Gateway::start().await;
    let (_raw, registered) = resumable(&gateway, gateway.addr()).await;
    assert_eq!(registered.session_id, registered.worker_id);
    assert_eq!(registered.resume_secret.len(), 32);
    assert_eq!(registered.reconnect_grace_ms, 15_000, "the default grace");
    assert!(!registered.resumed);
    // Control: a worker that does not say it can resume gets no session.
    let mut plain = Raw::connect(&gateway).await;
    let registered = plain.register(register_frame(&["work"])).await;
    assert_eq!(
        (
            registered.session_id,
            registered.resume_secret.len(),
            registered.reconnect_grace_ms
        ),
        (0, 0, 0)
    );
}

/// Runs one task on a worker registered `resumable` or not, and returns what the control
/// stream carried within `window` of the dispatch's outcome: the acknowledged ids, or `None`
/// for no `results_ack`.
async fn ack_after_one_result(resumable: bool, window: Duration) -> Option<Vec<u64>> {
    let gateway = Gateway::start().await;
    let (mut raw, _) = eligible(&gateway, gateway.addr(), resumable).await;
    let dispatch = dispatch(&gateway, b"in", PATIENCE);
    let (lane, task) = raw.next_task().await;
    lane.send(output(task.task_id, "done")).await;
    let outcome = outcome_of(dispatch).await;
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"done"))
    );
    match tokio::time::timeout(window, raw.next_control()).await {
        Ok(frame) => match frame.frame {
            Some(quic_control_down::Frame::ResultsAck(ack)) => Some(ack.task_ids),
            other => panic!("unexpected control frame {other:?}"),
        },
        Err(_) => None,
    }
}

/// A result for a dispatch that already ended (timed out; the result stands in for the cancel
/// acknowledgement and reaches no producer) is acknowledged all the same, so the worker forgets
/// it instead of resending it after every resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_a_dispatch_that_already_ended_is_still_acknowledged() {
    let gateway = Gateway::start().await;
    let (mut raw, _) = eligible(&gateway, gateway.addr(), true).await;
    let dispatch = dispatch(&gateway, b"in", Duration::from_millis(300));
    let (lane, task) = raw.next_task().await;
    let outcome = outcome_of(dispatch).await;
    assert_eq!(outcome, ActivityOutcome::TimedOut);
    lane.send(output(task.task_id, "late")).await;
    match tokio::time::timeout(PATIENCE, raw.next_control()).await {
        Ok(frame) => match frame.frame {
            Some(quic_control_down::Frame::ResultsAck(ack)) => {
                assert_eq!(ack.task_ids, vec![task.task_id]);
            }
            other => panic!("expected results_ack, got {other:?}"),
        },
        Err(_) => panic!("the result after the deadline was never acknowledged"),
    }
    eventually("the result counted as after its cancel", || {
        gateway.core.dispatcher().results_after_cancel() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_ack_goes_only_to_a_worker_that_registered_resumable() {
    // An absence has no event to wait for: 500 ms, 25 times the batch delay.
    let (plain, resumable) = tokio::join!(
        ack_after_one_result(false, Duration::from_millis(500)),
        ack_after_one_result(true, PATIENCE)
    );
    assert_eq!(plain, None, "a plain worker was sent results_ack");
    // Control: the same exchange with `resumable` set is acknowledged.
    assert_eq!(resumable.map(|ids| ids.len()), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_suspends_and_a_resume_takes_the_held_task_s_result_once() {
    let gateway = gateway().await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    let mut events = gateway.registry().subscribe_events();
    let (mut old, registered) = resumable(&gateway, relay.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    let dispatch = dispatch(&gateway, b"in", PATIENCE);
    let (_lane, task) = old.next_task().await;
    relay.freeze();
    event(
        &mut events,
        "suspended",
        |e| matches!(e, WorkerEvent::Suspended { worker: w, .. } if *w == worker),
    )
    .await;
    assert!(
        gateway.registry().worker(worker).is_some(),
        "a suspended worker is still registered"
    );
    assert!(!dispatch.is_finished(), "the producer still waits");

    let mut new = Raw::connect(&gateway).await;
    let secret = registered.resume_secret.clone();
    new.send_control(quic_control_up::Frame::Resume(resume_frame(
        &registered,
        secret,
        vec![task.task_id],
    )))
    .await;
    let answer = match new.next_control().await.frame {
        Some(quic_control_down::Frame::Registered(answer)) => answer,
        other => panic!("expected registered, got {other:?}"),
    };
    assert!(answer.resumed);
    assert_eq!(answer.worker_id, registered.worker_id, "same worker id");
    assert_eq!(answer.held_task_ids, vec![task.task_id]);
    assert_eq!(answer.resume_secret, registered.resume_secret);
    let (lane, held) = tokio::time::timeout(PATIENCE, new.held.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held, task.task_id, "the held task is put on a lane");
    lane.send(output(task.task_id, "done")).await;
    let outcome = outcome_of(dispatch).await;
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"done"))
    );
    match new.next_control().await.frame {
        Some(quic_control_down::Frame::ResultsAck(ack)) => {
            assert_eq!(ack.task_ids, vec![task.task_id]);
        }
        other => panic!("expected results_ack, got {other:?}"),
    }
    assert_eq!(gateway.core.dispatcher().refused().unknown, 0);
}

/// `docs/quic-protocol.md` 5.1, how fast a blackout ends a connection: a blackout shorter than
/// the QUIC idle timeout is invisible. The connection, its lane and the task on it survive, what
/// was lost is sent again, and the worker is neither suspended nor resumed; its result after the
/// blackout completes the task. Control: on the same connection, a blackout that outlasts the
/// idle timeout suspends the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackout_shorter_than_the_idle_timeout_is_invisible_and_a_longer_one_suspends() {
    const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
    // Four of the gateway's keep-alive intervals, so packets are lost both ways, and a fifth of
    // the idle timeout, so the timeout cannot end the connection even on a slow machine.
    const SHORT_BLACKOUT: Duration = Duration::from_millis(400);
    let config = QuicServerConfig {
        connection: ConnectionConfig {
            max_idle_timeout: IDLE_TIMEOUT,
            keep_alive_interval: Some(Duration::from_millis(100)),
            ..ConnectionConfig::default()
        },
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    // The worker's own keep-alives are packets sure to be lost in the blackout, so QUIC has
    // something to send again once the path is back.
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(Duration::from_millis(50)));
    let mut client = client_config(&gateway);
    client.transport_config(std::sync::Arc::new(transport));
    let mut events = gateway.registry().subscribe_events();
    let (mut raw, registered) = eligible_with(&gateway, relay.addr(), true, client).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    let dispatch = dispatch(&gateway, b"in", PATIENCE);
    let (lane, task) = raw.next_task().await;
    let lost_before = raw.conn.stats().path.lost_packets;

    relay.freeze();
    // The blackout itself: a length of time, with nothing to wait for.
    tokio::time::sleep(SHORT_BLACKOUT).await;
    relay.thaw();
    lane.send(output(task.task_id, "after the blackout")).await;
    assert_eq!(
        outcome_of(dispatch).await,
        ActivityOutcome::Completed(Bytes::from_static(b"after the blackout")),
        "the task survived on its lane"
    );
    // Losses are declared when a later packet is acknowledged, which may come after the result.
    eventually("the blackout lost packets of the worker's", || {
        raw.conn.stats().path.lost_packets > lost_before
    })
    .await;
    assert!(raw.conn.close_reason().is_none(), "the connection lives");
    assert_eq!(
        suspended(&gateway, worker),
        Some(false),
        "the same worker id, registered and not suspended"
    );
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(
                event,
                WorkerEvent::Suspended { worker: w, .. }
                    | WorkerEvent::Disconnected { worker: w, .. }
                    | WorkerEvent::Resumed { worker: w } if w == worker
            ),
            "the short blackout was seen: {event:?}"
        );
    }

    relay.freeze();
    let ended = suspended_or_left(&mut events, worker).await;
    assert!(
        matches!(ended, WorkerEvent::Suspended { .. }),
        "the long blackout: {ended:?}"
    );
}

/// A worker that shrank its capacity while two tasks ran resumes holding more tasks than it
/// has slots: the gateway opens a lane for each held task (section 5.1), and both results
/// complete their dispatches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_holding_more_tasks_than_slots_gets_a_lane_for_each() {
    let gateway = gateway().await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    let mut events = gateway.registry().subscribe_events();
    let (mut old, registered) = resumable(&gateway, relay.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    let announced = |capacity: u32| {
        move |e: &WorkerEvent| {
            matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: c }
                if *w == worker && *c == capacity)
        }
    };
    old.announce(2).await;
    event(&mut events, "capacity 2", announced(2)).await;
    let (first, second) = (
        dispatch(&gateway, b"one", PATIENCE),
        dispatch(&gateway, b"two", PATIENCE),
    );
    let (_, a) = old.next_task().await;
    let (_, b) = old.next_task().await;
    old.announce(1).await;
    event(&mut events, "capacity 1", announced(1)).await;
    relay.freeze();
    event(
        &mut events,
        "suspended",
        |e| matches!(e, WorkerEvent::Suspended { worker: w, .. } if *w == worker),
    )
    .await;

    let mut new = Raw::connect(&gateway).await;
    new.send_control(quic_control_up::Frame::Resume(resume_frame(
        &registered,
        registered.resume_secret.clone(),
        vec![a.task_id, b.task_id],
    )))
    .await;
    let answer = match new.next_control().await.frame {
        Some(quic_control_down::Frame::Registered(answer)) => answer,
        other => panic!("expected registered, got {other:?}"),
    };
    let mut held_ids = answer.held_task_ids.clone();
    held_ids.sort_unstable();
    let mut expected = vec![a.task_id, b.task_id];
    expected.sort_unstable();
    assert_eq!(held_ids, expected);
    let mut lanes = Vec::new();
    for _ in 0..2 {
        let (lane, held) = tokio::time::timeout(PATIENCE, new.held.recv())
            .await
            .unwrap()
            .unwrap();
        lanes.push((lane, held));
    }
    assert_ne!(lanes[0].0.index, lanes[1].0.index, "one lane per held task");
    // Each held task answered with its input: the dispatch it belongs to hears its own.
    for (lane, held) in &lanes {
        let input = if *held == a.task_id {
            &a.input
        } else {
            &b.input
        };
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: *held,
            outcome: Some(quic_result::Outcome::Output(input.clone())),
        }))
        .await;
    }
    for (dispatch, text) in [(first, "one"), (second, "two")] {
        let outcome = outcome_of(dispatch).await;
        assert_eq!(
            outcome,
            ActivityOutcome::Completed(Bytes::from_static(text.as_bytes()))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_by_name_and_changes_nothing() {
    let gateway = gateway().await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    let mut events = gateway.registry().subscribe_events();
    let (_old, registered) = resumable(&gateway, relay.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    relay.freeze();
    event(
        &mut events,
        "suspended",
        |e| matches!(e, WorkerEvent::Suspended { worker: w, .. } if *w == worker),
    )
    .await;

    let mut wrong = registered.resume_secret.to_vec();
    wrong[0] ^= 1;
    let mut thief = Raw::connect(&gateway).await;
    thief
        .send_control(quic_control_up::Frame::Resume(resume_frame(
            &registered,
            wrong.into(),
            Vec::new(),
        )))
        .await;
    let (code, reason) = thief.closed().await;
    assert_eq!(code, ErrorCode::ResumeRefused);
    assert!(
        reason.starts_with("resume refused: wrong_secret"),
        "{reason}"
    );
    assert_eq!(suspended(&gateway, worker), Some(true), "still suspended");
    // Control: the right secret resumes the same session.
    let mut owner = Raw::connect(&gateway).await;
    owner
        .send_control(quic_control_up::Frame::Resume(resume_frame(
            &registered,
            registered.resume_secret.clone(),
            Vec::new(),
        )))
        .await;
    match owner.next_control().await.frame {
        Some(quic_control_down::Frame::Registered(answer)) => assert!(answer.resumed),
        other => panic!("expected registered, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_while_the_old_connection_lives_closes_the_old_one_superseded() {
    let gateway = Gateway::start().await;
    let (old, registered) = resumable(&gateway, gateway.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    let mut events = gateway.registry().subscribe_events();
    let mut new = Raw::connect(&gateway).await;
    new.send_control(quic_control_up::Frame::Resume(resume_frame(
        &registered,
        registered.resume_secret.clone(),
        Vec::new(),
    )))
    .await;
    match new.next_control().await.frame {
        Some(quic_control_down::Frame::Registered(answer)) => assert!(answer.resumed),
        other => panic!("expected registered, got {other:?}"),
    }
    let (code, reason) = old.closed().await;
    assert_eq!(code, ErrorCode::Superseded);
    assert_eq!(reason, "superseded by a resumed connection");
    // The old connection's end let the worker be: the newer connection holds it.
    assert!(gateway.registry().is_registered(worker));
    // The listener tracks the new connection once it serves it; the old one's end must not
    // untrack it.
    eventually("the new connection tracked", || {
        gateway.server.registered_workers() == 1
    })
    .await;
    assert_eq!(suspended(&gateway, worker), Some(false), "not suspended");
    // The newer connection serves the worker: a dispatch reaches it there.
    let dispatch = gateway.dispatch("work", b"x");
    let answer = async {
        let (lane, task) = new.next_task().await;
        lane.send(output(task.task_id, "new")).await;
    };
    let (outcome, ()) = tokio::join!(dispatch, answer);
    assert_eq!(
        outcome,
        ActivityOutcome::Completed(Bytes::from_static(b"new"))
    );
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(
                event,
                WorkerEvent::Suspended { .. } | WorkerEvent::Disconnected { .. }
            ),
            "the old connection's end touched the session: {event:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_closes_with_closed_leaves_and_is_not_suspended() {
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let (raw, registered) = resumable(&gateway, gateway.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    raw.conn
        .close(ErrorCode::Closed.var_int(), b"worker stopping");
    let left = event(&mut events, "left or suspended", |e| {
        matches!(e, WorkerEvent::Disconnected { worker: w, .. } | WorkerEvent::Suspended { worker: w, .. } if *w == worker)
    })
    .await;
    // The control is the lost connection above, which suspends.
    assert_eq!(
        left,
        WorkerEvent::Disconnected {
            worker,
            reason: DisconnectReason::Closed
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_result_is_acknowledged_once_in_batches() {
    // More than one full batch (256 ids), so the cap on a frame is exercised.
    const RESULTS: u64 = 600;
    let gateway = Gateway::start().await;
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::connect(&gateway).await;
    let registered = raw
        .register(switchyard_proto::v1::QuicRegister {
            resumable: true,
            ..register_frame(&["work"])
        })
        .await;
    let worker = WorkerId::from_raw(registered.worker_id);
    raw.announce(64).await;
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: 64 } if *w == worker),
    )
    .await;
    let mut dispatches = tokio::task::JoinSet::new();
    for _ in 0..RESULTS {
        let core = gateway.core.clone();
        dispatches.spawn(async move {
            core.dispatcher()
                .dispatch(
                    &switchyard_core::CallerIdentity::trusted("test"),
                    crate::support::request("work", b"in", PATIENCE),
                )
                .await
                .unwrap()
        });
    }
    let mut answered = std::collections::BTreeSet::new();
    while (answered.len() as u64) < RESULTS {
        let (lane, task) = raw.next_task().await;
        lane.send(output(task.task_id, "ok")).await;
        answered.insert(task.task_id);
    }
    while let Some(outcome) = dispatches.join_next().await {
        assert!(matches!(outcome.unwrap(), ActivityOutcome::Completed(_)));
    }
    let mut acknowledged = std::collections::BTreeSet::new();
    let mut frames = 0;
    while acknowledged.len() < answered.len() {
        match raw.next_control().await.frame {
            Some(quic_control_down::Frame::ResultsAck(ack)) => {
                frames += 1;
                assert!(ack.task_ids.len() <= 256, "at most 256 ids a frame");
                for id in ack.task_ids {
                    assert!(acknowledged.insert(id), "task {id} acknowledged twice");
                }
            }
            other => panic!("expected results_ack, got {other:?}"),
        }
    }
    assert_eq!(acknowledged, answered, "every result acknowledged");
    println!("{RESULTS} results acknowledged in {frames} results_ack frames");
}

/// Resumes `registered`'s session on a new connection made with `config`, listing `running`;
/// returns the connection and the gateway's `registered` answer.
async fn resume_with(
    gateway: &Gateway,
    config: quinn::ClientConfig,
    registered: &QuicRegistered,
    running: Vec<u64>,
) -> (Raw, QuicRegistered) {
    let mut raw = Raw::connect_with(gateway, config, None).await;
    raw.send_control(quic_control_up::Frame::Resume(resume_frame(
        registered,
        registered.resume_secret.clone(),
        running,
    )))
    .await;
    let answer = match raw.next_control().await.frame {
        Some(quic_control_down::Frame::Registered(answer)) => answer,
        other => panic!("expected registered, got {other:?}"),
    };
    (raw, answer)
}

/// Resumes `registered`'s session on a new connection, holding no task.
async fn resume(gateway: &Gateway, registered: &QuicRegistered) -> (Raw, QuicRegistered) {
    resume_with(gateway, client_config(gateway), registered, Vec::new()).await
}

/// Sends `resume` for `registered`'s session with its own secret on a new connection, and
/// returns how the gateway closed that connection.
async fn refused_resume(gateway: &Gateway, registered: &QuicRegistered) -> (ErrorCode, String) {
    let mut raw = Raw::connect(gateway).await;
    raw.send_control(quic_control_up::Frame::Resume(resume_frame(
        registered,
        registered.resume_secret.clone(),
        Vec::new(),
    )))
    .await;
    raw.closed().await
}

/// Asserts that a resume of `registered`'s session, with its own secret, is refused as
/// `unknown_session`: the gateway keeps no session for it.
async fn assert_no_session(gateway: &Gateway, registered: &QuicRegistered) {
    let (code, reason) = refused_resume(gateway, registered).await;
    assert_eq!(code, ErrorCode::ResumeRefused);
    assert!(
        reason.starts_with("resume refused: unknown_session"),
        "{reason}"
    );
}

/// Waits for `worker`'s session to be suspended or the worker to leave, whichever comes first.
async fn suspended_or_left(
    events: &mut tokio::sync::broadcast::Receiver<WorkerEvent>,
    worker: WorkerId,
) -> WorkerEvent {
    event(events, "suspended or left", |e| {
        matches!(e, WorkerEvent::Suspended { worker: w, .. }
            | WorkerEvent::Disconnected { worker: w, .. } if *w == worker)
    })
    .await
}

/// A gateway whose prober finds a silent worker within a second: pings every 100 ms, missed
/// after 300 ms, silence for 1 s ends the connection. The gateway's config check wants the
/// window longer than the ping interval and the ping timeout; 1 s leaves room for loopback
/// under load.
async fn quick_liveness_gateway() -> Gateway {
    let mut core = switchyard_core::CoreConfig::default();
    core.liveness.ping_interval = Duration::from_millis(100);
    core.liveness.ping_timeout = Duration::from_millis(300);
    core.liveness.heartbeat_window = Duration::from_secs(1);
    Gateway::with_core(core).await
}

/// Registers a worker, resumable or not, makes it stop answering pings while its connection
/// stays up, checks the gateway closes the connection `DEREGISTERED` for the timeout, and
/// returns the gateway, the registration and how the worker's registration ended.
async fn silenced(resumable: bool) -> (Gateway, QuicRegistered, WorkerEvent) {
    let gateway = quick_liveness_gateway().await;
    let mut events = gateway.registry().subscribe_events();
    let (raw, registered) = eligible(&gateway, gateway.addr(), resumable).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    raw.silent.store(true, std::sync::atomic::Ordering::Relaxed);
    // Either way the gateway closes the connection for silence.
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::Deregistered, "{reason}");
    assert!(
        reason.contains("deregistered by the gateway: timeout"),
        "{reason}"
    );
    let ended = suspended_or_left(&mut events, worker).await;
    // The connection's own end is handled after the close is sent; it must not undo the
    // suspension.
    eventually("the connection untracked", || {
        gateway.server.registered_workers() == 0
    })
    .await;
    (gateway, registered, ended)
}

/// Silence for the liveness window closes the connection `DEREGISTERED` (timeout), yet a
/// session worker is only suspended and resumes (section 5.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_worker_is_closed_deregistered_yet_suspended_and_resumes() {
    let (gateway, registered, ended) = silenced(true).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    assert!(
        matches!(ended, WorkerEvent::Suspended { .. }),
        "not suspended: {ended:?}"
    );
    assert_eq!(
        suspended(&gateway, worker),
        Some(true),
        "suspended after its connection's end"
    );
    let (_new, answer) = resume(&gateway, &registered).await;
    assert!(answer.resumed);
    assert_eq!(answer.worker_id, registered.worker_id, "same worker id");
}

/// The control for the test above: the same silence ends a worker without a session, and
/// nothing is left to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_without_a_session_is_deregistered_and_cannot_resume() {
    let (gateway, registered, ended) = silenced(false).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    assert_eq!(
        ended,
        WorkerEvent::Disconnected {
            worker,
            reason: DisconnectReason::Timeout
        }
    );
    assert!(gateway.registry().worker(worker).is_none());
    // A plain registration has no secret; the session id is the worker id all the same.
    let registered = QuicRegistered {
        session_id: registered.worker_id,
        ..registered
    };
    assert_no_session(&gateway, &registered).await;
}

/// A resumable raw worker behind a relay, holding the task of one dispatch.
struct Holding {
    gateway: Gateway,
    relay: UdpRelay,
    events: tokio::sync::broadcast::Receiver<WorkerEvent>,
    raw: Raw,
    registered: QuicRegistered,
    worker: WorkerId,
    dispatch: tokio::task::JoinHandle<ActivityOutcome>,
    task: switchyard_proto::v1::QuicTask,
}

/// Registers a resumable raw worker through a relay and dispatches one task with `timeout` to
/// it; returns once the worker holds the task.
async fn holding_a_task(timeout: Duration) -> Holding {
    let gateway = gateway().await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    let events = gateway.registry().subscribe_events();
    let (mut raw, registered) = resumable(&gateway, relay.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    let dispatch = dispatch(&gateway, b"in", timeout);
    let (_lane, task) = raw.next_task().await;
    Holding {
        gateway,
        relay,
        events,
        raw,
        registered,
        worker,
        dispatch,
        task,
    }
}

/// A fault the gateway closes the connection for ends a session worker's session: it leaves at
/// once, its task goes to another worker as a new attempt, and a resume finds no session.
/// Control: the same worker's lost connection suspends it, its task waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fault_the_gateway_closes_for_ends_the_session_where_a_lost_connection_suspends() {
    for lost in [true, false] {
        let Holding {
            gateway,
            relay,
            mut events,
            mut raw,
            registered,
            worker,
            dispatch,
            task,
        } = holding_a_task(PATIENCE).await;
        if lost {
            relay.freeze();
        } else {
            // A frame whose body is no protobuf message.
            raw.send_control_bytes(&[0, 0, 0, 2, 0x0f, 0x01]).await;
            let (code, reason) = raw.closed().await;
            assert_eq!(code, ErrorCode::MalformedFrame, "{reason}");
        }
        let ended = suspended_or_left(&mut events, worker).await;
        if lost {
            assert!(
                matches!(ended, WorkerEvent::Suspended { .. }),
                "lost: {ended:?}"
            );
            assert!(!dispatch.is_finished(), "the producer still waits");
            let (_new, answer) = resume_with(
                &gateway,
                client_config(&gateway),
                &registered,
                vec![task.task_id],
            )
            .await;
            assert!(answer.resumed);
            assert_eq!(answer.held_task_ids, vec![task.task_id]);
            continue;
        }
        assert_eq!(
            ended,
            WorkerEvent::Disconnected {
                worker,
                reason: DisconnectReason::Closed
            }
        );
        assert!(gateway.registry().worker(worker).is_none());
        let (mut other, _) = eligible(&gateway, gateway.addr(), false).await;
        let (lane, again) = other.next_task().await;
        assert_eq!(again.input, task.input, "the same dispatch");
        assert_eq!(again.attempt, task.attempt + 1, "dispatched again");
        lane.send(output(again.task_id, "done")).await;
        assert_eq!(
            outcome_of(dispatch).await,
            ActivityOutcome::Completed(Bytes::from_static(b"done"))
        );
        assert_no_session(&gateway, &registered).await;
    }
}

/// A task whose deadline passes while its worker is suspended is cancelled on its lane after
/// the resume; a result sent for it instead of `cancel_ack` is refused as late (section 5.1).
/// Control: a `cancel_ack` is no refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_instead_of_a_cancel_ack_after_a_resume_is_refused_late() {
    for answers_with_result in [true, false] {
        // Suspension takes the 500 ms idle timeout; the deadline is well after it.
        let Holding {
            gateway,
            relay,
            mut events,
            registered,
            worker,
            dispatch,
            task,
            // Kept open: the relay's freeze, not a close, is what suspends it.
            raw: _old,
        } = holding_a_task(Duration::from_secs(3)).await;
        relay.freeze();
        let ended = suspended_or_left(&mut events, worker).await;
        assert!(matches!(ended, WorkerEvent::Suspended { .. }), "{ended:?}");
        assert!(
            !dispatch.is_finished(),
            "the deadline passes while suspended"
        );
        assert_eq!(outcome_of(dispatch).await, ActivityOutcome::TimedOut);

        let (mut new, answer) = resume_with(
            &gateway,
            client_config(&gateway),
            &registered,
            vec![task.task_id],
        )
        .await;
        assert!(answer.resumed);
        assert_eq!(answer.held_task_ids, vec![task.task_id]);
        let (held_lane, held) = tokio::time::timeout(PATIENCE, new.held.recv())
            .await
            .expect("a held frame")
            .expect("the lanes are read");
        assert_eq!(held, task.task_id);
        let (lane, cancel) = tokio::time::timeout(PATIENCE, new.cancels.recv())
            .await
            .expect("the owed cancel")
            .expect("the lanes are read");
        assert_eq!(cancel.task_id, task.task_id);
        assert_eq!(
            cancel.reason,
            switchyard_proto::v1::QuicCancelReason::DeadlineExceeded as i32
        );
        assert_eq!(lane.index, held_lane.index, "on the held task's lane");
        if answers_with_result {
            lane.send(output(task.task_id, "late")).await;
        } else {
            lane.send(quic_lane_up::Frame::CancelAck(
                switchyard_proto::v1::QuicCancelAck {
                    task_id: task.task_id,
                },
            ))
            .await;
        }
        eventually("the slot freed", || {
            gateway
                .registry()
                .worker(worker)
                .is_some_and(|w| w.in_flight == 0)
        })
        .await;
        let late = gateway.core.dispatcher().refused().late;
        assert_eq!(
            late,
            u64::from(answers_with_result),
            "answered with a result: {answers_with_result}"
        );
    }
}

/// A client config that grants the gateway `streams` bidirectional streams.
fn granting(gateway: &Gateway, streams: u32) -> quinn::ClientConfig {
    let mut config = client_config(gateway);
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(quinn::VarInt::from_u32(streams));
    config.transport_config(std::sync::Arc::new(transport));
    config
}

/// A resumable worker of capacity `capacity`, holding no task, suspended by a lost connection,
/// on a gateway with a 2 s registration deadline.
async fn suspended_with_capacity(capacity: u32) -> (Gateway, UdpRelay, QuicRegistered) {
    let config = QuicServerConfig {
        connection: ConnectionConfig {
            max_idle_timeout: Duration::from_millis(500),
            keep_alive_interval: Some(Duration::from_millis(100)),
            ..ConnectionConfig::default()
        },
        registration_timeout: Duration::from_secs(2),
        ..QuicServerConfig::default()
    };
    let gateway = Gateway::with(config, AllowAll).await;
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    let mut events = gateway.registry().subscribe_events();
    let (mut old, registered) = resumable(&gateway, relay.addr()).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    old.announce(capacity).await;
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, capacity: c } if *w == worker && *c == capacity),
    )
    .await;
    relay.freeze();
    let ended = suspended_or_left(&mut events, worker).await;
    assert!(matches!(ended, WorkerEvent::Suspended { .. }), "{ended:?}");
    (gateway, relay, registered)
}

/// A resume opens one lane per slot of the session's capacity before it answers: a worker of
/// capacity 3 that grants exactly 3 streams is answered and runs three tasks at once, each on a
/// lane of its own. Control: granting 2 streams, the resume is never answered and the
/// registration deadline closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_opens_a_lane_for_each_slot_before_it_answers() {
    let (gateway, _relay, registered) = suspended_with_capacity(3).await;
    let (mut new, answer) =
        resume_with(&gateway, granting(&gateway, 3), &registered, Vec::new()).await;
    assert!(answer.resumed);
    assert!(answer.held_task_ids.is_empty());
    let dispatches =
        ["one", "two", "six"].map(|input| dispatch(&gateway, input.as_bytes(), PATIENCE));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(new.next_task().await);
    }
    let mut lanes: Vec<u64> = tasks.iter().map(|(lane, _)| lane.index).collect();
    lanes.sort_unstable();
    lanes.dedup();
    assert_eq!(lanes.len(), 3, "three tasks at once, one a lane");
    for (lane, task) in &tasks {
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: task.task_id,
            outcome: Some(quic_result::Outcome::Output(task.input.clone())),
        }))
        .await;
    }
    for dispatch in dispatches {
        assert!(matches!(
            outcome_of(dispatch).await,
            ActivityOutcome::Completed(_)
        ));
    }

    let (gateway, _relay, registered) = suspended_with_capacity(3).await;
    let mut short = Raw::connect_with(&gateway, granting(&gateway, 2), None).await;
    short
        .send_control(quic_control_up::Frame::Resume(resume_frame(
            &registered,
            registered.resume_secret.clone(),
            Vec::new(),
        )))
        .await;
    let (code, reason) = short.closed().await;
    assert_eq!(code, ErrorCode::RegistrationTimeout, "{reason}");
}
