//! Closes that tell the worker what comes next: an operator's (or the worker's own) drain is
//! final, a shutdown asks it to come back, and what was queued before a close reaches the
//! worker before the close does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_core::{ActivityOutcome, WorkerEvent, WorkerId};
use switchyard_proto::v1::{
    QuicCancel, QuicCancelReason, QuicControlDown, QuicDrain, QuicDrainReason, QuicDrainRequest,
    quic_control_down, quic_control_up,
};
use switchyard_proto::v1::{QuicResult, quic_lane_up, quic_result};
use switchyard_test_support::UdpRelay;
use switchyard_transport_quic::{Backoff, ErrorCode};

use crate::support::{Gateway, PATIENCE, Raw, RawLane, client_config, event, register_frame};

/// How long the gateway waits at most for a worker to acknowledge what it flushed before a
/// close (`docs/quic-protocol.md`, section 4: "about a second at most").
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// A raw worker registered with capacity `n`, its capacity in force.
async fn announced(gateway: &Gateway, n: u32) -> (Raw, WorkerId) {
    announced_at(gateway, gateway.addr(), n).await
}

/// [`announced`], connected to `addr` (the gateway, or a relay in front of it).
async fn announced_at(gateway: &Gateway, addr: SocketAddr, n: u32) -> (Raw, WorkerId) {
    let mut events = gateway.registry().subscribe_events();
    let mut raw = Raw::dial(addr, "127.0.0.1:0", client_config(gateway), None).await;
    let registered = raw.register(register_frame(&["work"])).await;
    raw.announce(n).await;
    let worker = WorkerId::from_raw(registered.worker_id);
    event(
        &mut events,
        "capacity announced",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker: w, .. } if *w == worker),
    )
    .await;
    (raw, worker)
}

fn drain(reason: QuicDrainReason) -> QuicControlDown {
    QuicControlDown {
        frame: Some(quic_control_down::Frame::Drain(QuicDrain {
            reason: reason.into(),
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_drained_worker_gets_the_drain_frame_before_the_final_close() {
    // Alternately the operator's drain and the worker's own drain_request, ten times: the
    // close used to overtake the drain frame every time.
    for round in 0..10 {
        let gateway = Gateway::start().await;
        let (mut raw, worker) = announced(&gateway, 1).await;
        if round % 2 == 0 {
            assert!(gateway.registry().drain_worker(worker));
        } else {
            raw.send_control(quic_control_up::Frame::DrainRequest(QuicDrainRequest {}))
                .await;
        }
        assert_eq!(
            raw.next_control().await,
            drain(QuicDrainReason::Requested),
            "round {round}: the drain frame arrives, saying the drain was requested"
        );
        let (code, reason) = raw.closed().await;
        assert_eq!(code, ErrorCode::Drained, "round {round}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_during_a_shutdown_is_told_to_come_back_later() {
    let gateway = Gateway::start().await;
    // Control: before the shutdown the same registration is admitted.
    let (_admitted, _) = announced(&gateway, 1).await;
    gateway.registry().broadcast_shutdown();
    let mut raw = Raw::connect(&gateway).await;
    raw.send_control(quic_control_up::Frame::Register(register_frame(&["work"])))
        .await;
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::ShuttingDown, "{reason}");
    assert!(!code.is_final(), "a worker refused now must come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_tells_an_idle_worker_to_come_back_later() {
    let gateway = Gateway::start().await;
    let (mut raw, _) = announced(&gateway, 2).await;
    gateway.core.shutdown(PATIENCE).await;
    assert_eq!(
        raw.next_control().await,
        drain(QuicDrainReason::ShuttingDown)
    );
    let (code, reason) = raw.closed().await;
    assert_eq!(
        code,
        ErrorCode::ShuttingDown,
        "not a final DRAINED: {reason}"
    );
    assert!(!code.is_final());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_cancel_reaches_a_busy_worker_every_time() {
    for round in 0..20 {
        let gateway = Arc::new(Gateway::start().await);
        let (mut raw, _) = announced(&gateway, 1).await;
        let dispatch = tokio::spawn({
            let gateway = Arc::clone(&gateway);
            async move { gateway.dispatch("work", b"held").await }
        });
        let (_lane, task) = raw.next_task().await;
        // The raw worker never answers: the grace ends with the task held.
        gateway.core.shutdown(Duration::from_millis(10)).await;
        gateway.server.shutdown().await;
        assert_eq!(
            raw.next_control().await,
            drain(QuicDrainReason::ShuttingDown),
            "round {round}"
        );
        let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
            .await
            .unwrap_or_else(|_| panic!("round {round}: no cancel before the close"))
            .map(|(_, cancel)| cancel);
        assert_eq!(
            cancel,
            Some(QuicCancel {
                task_id: task.task_id,
                reason: QuicCancelReason::ShuttingDown.into(),
            }),
            "round {round}"
        );
        let (code, _) = raw.closed().await;
        assert_eq!(code, ErrorCode::ShuttingDown, "round {round}");
        assert_eq!(dispatch.await.unwrap(), ActivityOutcome::ShuttingDown);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_comes_back_by_itself_after_a_shutdown_but_not_after_a_drain() {
    let first = Gateway::start().await;
    let fast = Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    };
    let worker = first.worker().backoff(fast).connect().await.unwrap();
    let handle = worker.handle();
    let mut registrations = handle.registrations();
    let run = tokio::spawn(worker.run());
    first.core.shutdown(PATIENCE).await;
    first.server.shutdown().await;
    first.server.wait_idle().await;
    tokio::time::timeout(PATIENCE, registrations.wait_for(Option::is_none))
        .await
        .expect("the worker saw the shutdown")
        .unwrap();
    let (addr, ca) = (first.addr(), Arc::clone(&first.ca));
    drop(first);

    let second = Gateway::at(addr, ca, None).await;
    let again = tokio::time::timeout(PATIENCE, registrations.wait_for(Option::is_some))
        .await
        .expect("a worker told SHUTTING_DOWN registers again")
        .unwrap()
        .expect("registered");
    assert!(!run.is_finished(), "a shutdown is not a final drain");
    crate::support::eventually("eligible at the new gateway", || {
        second.census("echo").eligible == 1
    })
    .await;
    assert_eq!(
        second.dispatch("echo", b"back").await,
        ActivityOutcome::Completed("back".into())
    );

    // Control: the operator's drain is final, and `run` ends.
    assert!(second.registry().drain_worker(again));
    tokio::time::timeout(PATIENCE, run)
        .await
        .expect("a drained worker stops")
        .unwrap()
        .expect("cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drain_stays_final_through_a_shutdown() {
    let gateway = Arc::new(Gateway::start().await);
    let (mut raw, worker) = announced(&gateway, 1).await;
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"held").await }
    });
    let (_lane, task) = raw.next_task().await;
    assert!(gateway.registry().drain_worker(worker));
    assert_eq!(raw.next_control().await, drain(QuicDrainReason::Requested));
    gateway.core.shutdown(Duration::from_millis(10)).await;
    gateway.server.shutdown().await;
    let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
        .await
        .unwrap()
        .map(|(_, cancel)| cancel);
    assert_eq!(cancel.map(|c| c.task_id), Some(task.task_id));
    let (code, reason) = raw.closed().await;
    assert_eq!(code, ErrorCode::Drained, "the final drain wins: {reason}");
    assert_eq!(dispatch.await.unwrap(), ActivityOutcome::ShuttingDown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_at_a_drain_deadline_says_so() {
    let gateway = Arc::new(Gateway::start().await);
    let (mut raw, worker) = announced(&gateway, 1).await;
    let dispatch = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("work", b"held").await }
    });
    let (_lane, task) = raw.next_task().await;
    assert!(gateway.registry().drain_worker(worker));
    gateway
        .core
        .dispatcher()
        .cancel_held_by(worker, switchyard_core::CancelReason::DrainDeadline);
    let cancel = tokio::time::timeout(PATIENCE, raw.cancels.recv())
        .await
        .unwrap()
        .map(|(_, cancel)| cancel);
    assert_eq!(
        cancel,
        Some(QuicCancel {
            task_id: task.task_id,
            // Not REQUESTED: the producer did not cancel.
            reason: QuicCancelReason::DrainDeadline.into(),
        })
    );
    dispatch.abort();
}

/// Has the raw worker `raw` of capacity `n` run one task on each of its lanes at once, so it
/// has accepted every lane; returns the lanes' indexes.
async fn every_lane_used(gateway: &Arc<Gateway>, raw: &mut Raw, n: usize) -> BTreeSet<u64> {
    let dispatches: Vec<_> = (0..n)
        .map(|_| {
            let gateway = Arc::clone(gateway);
            tokio::spawn(async move { gateway.dispatch("work", b"one each").await })
        })
        .collect();
    // Every task is held until all have arrived: each occupies a lane of its own.
    let mut held: Vec<(RawLane, u64)> = Vec::new();
    for _ in 0..n {
        let (lane, task) = raw.next_task().await;
        held.push((lane, task.task_id));
    }
    for (lane, task_id) in &held {
        lane.send(quic_lane_up::Frame::Result(QuicResult {
            task_id: *task_id,
            outcome: Some(quic_result::Outcome::Output("done".into())),
        }))
        .await;
    }
    for dispatch in dispatches {
        assert_eq!(
            dispatch.await.unwrap(),
            ActivityOutcome::Completed("done".into())
        );
    }
    let lanes: BTreeSet<u64> = held.iter().map(|(lane, _)| lane.index).collect();
    assert_eq!(lanes.len(), n, "one task on each lane: {lanes:?}");
    lanes
}

/// How each of `lanes` ended on the raw worker's side: `"FIN"`, or the read's error.
async fn lane_ends(raw: &mut Raw, lanes: &BTreeSet<u64>) -> BTreeMap<u64, String> {
    let mut ends = BTreeMap::new();
    while ends.len() < lanes.len() {
        let (index, end) = tokio::time::timeout(PATIENCE, raw.lane_ends.recv())
            .await
            .unwrap_or_else(|_| panic!("lanes still open; ended so far: {ends:?}"))
            .expect("the lane readers are gone");
        let end = match end {
            Ok(()) => "FIN".to_owned(),
            Err(error) => error.to_string(),
        };
        ends.insert(index, end);
    }
    ends
}

/// Section 4, "Flush, then close": before a drain's or a shutdown's close the gateway finishes
/// its side of the control stream and of every lane, so a worker reads each to a clean end
/// (a FIN) rather than losing it to the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_stream_and_every_lane_end_with_a_fin_before_the_close() {
    for shutdown in [false, true] {
        let gateway = Arc::new(Gateway::start().await);
        let (mut raw, worker) = announced(&gateway, 3).await;
        let lanes = every_lane_used(&gateway, &mut raw, 3).await;
        let (reason, code) = if shutdown {
            gateway.core.shutdown(PATIENCE).await;
            (QuicDrainReason::ShuttingDown, ErrorCode::ShuttingDown)
        } else {
            assert!(gateway.registry().drain_worker(worker));
            (QuicDrainReason::Requested, ErrorCode::Drained)
        };
        assert_eq!(raw.next_control().await, drain(reason));
        assert!(
            raw.control_stream_end().await.is_ok(),
            "shutdown {shutdown}: the control stream ends with a FIN"
        );
        let fins = lanes.iter().map(|i| (*i, "FIN".to_owned())).collect();
        assert_eq!(
            lane_ends(&mut raw, &lanes).await,
            fins,
            "shutdown {shutdown}"
        );
        let (closed, phrase) = raw.closed().await;
        assert_eq!(closed, code, "shutdown {shutdown}: {phrase}");
    }
    // Control: a close for a protocol violation is not flushed, and the same reading of the
    // lanes sees each end by the connection's close, not by a FIN.
    let gateway = Arc::new(Gateway::start().await);
    let (mut raw, _) = announced(&gateway, 3).await;
    let lanes = every_lane_used(&gateway, &mut raw, 3).await;
    raw.send_control_bytes(&[0, 0, 0, 2, 0xff, 0xff]).await;
    let ends = lane_ends(&mut raw, &lanes).await;
    assert_eq!(ends.len(), 3);
    assert!(
        ends.values().all(|end| end != "FIN"),
        "a violation's close ends the lanes without a FIN: {ends:?}"
    );
    let (closed, phrase) = raw.closed().await;
    assert_eq!(closed, ErrorCode::MalformedFrame, "{phrase}");
}

/// Section 4: the gateway waits for the worker to acknowledge the flushed streams about a second
/// at most, so a worker that no longer answers does not hold its drain up until the idle
/// timeout (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_about_a_second_for_a_worker_that_never_acknowledges() {
    let gateway = Arc::new(Gateway::start().await);
    let relay = UdpRelay::start(gateway.addr()).await.unwrap();
    // Control: a worker that acknowledges is let go as soon as it has.
    let (mut answering, answering_id) = announced(&gateway, 2).await;
    every_lane_used(&gateway, &mut answering, 2).await;
    let waited = drained_after(&gateway, answering_id).await;
    assert!(
        waited < FLUSH_WAIT,
        "an answering worker held up {waited:?}"
    );
    let (mut silent, silent_id) = announced_at(&gateway, relay.addr(), 2).await;
    every_lane_used(&gateway, &mut silent, 2).await;
    // Nothing reaches the silent worker any more, and it acknowledges nothing.
    relay.freeze();
    let waited = drained_after(&gateway, silent_id).await;
    assert!(waited >= FLUSH_WAIT, "gave up after {waited:?}");
    assert!(waited < 3 * FLUSH_WAIT, "waited {waited:?}");
}

/// Drains `worker` and returns how long it took to leave (as drained).
async fn drained_after(gateway: &Gateway, worker: WorkerId) -> Duration {
    let mut events = gateway.registry().subscribe_events();
    let started = Instant::now();
    assert!(gateway.registry().drain_worker(worker));
    let left = event(
        &mut events,
        "the drained worker leaves",
        |e| matches!(e, WorkerEvent::Disconnected { worker: w, .. } if *w == worker),
    )
    .await;
    let waited = started.elapsed();
    assert!(
        matches!(
            left,
            WorkerEvent::Disconnected {
                reason: switchyard_core::DisconnectReason::Drained,
                ..
            }
        ),
        "{left:?}"
    );
    waited
}
