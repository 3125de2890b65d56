//! Tasks and results crossing the transport: round trip, capacity, rotation, one outcome each.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;

use crate::outcome::{ActivityOutcome, TaskResult};
use crate::testkit::fixture::{Fixture, STEP, Verdict, ensure, join, request};
use crate::testkit::handler::{Handler, TaskCall};
use crate::testkit::harness::{ConformanceWorker, TransportHarness};
use crate::testkit::probe::Probe;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Echoes its input, except `fail:<message>` which fails retryably with `<message>`.
fn echo_or_fail() -> Handler {
    Handler::new(|call: TaskCall| async move {
        match call.input.strip_prefix(b"fail:") {
            Some(message) => TaskResult::Failure {
                message: String::from_utf8_lossy(message).into_owned(),
                retryable: true,
            },
            None => TaskResult::Success(call.input),
        }
    })
}

pub(super) async fn round_trip<H: TransportHarness>(fixture: Fixture<'_, H>) -> Verdict {
    let (_worker, probe) = fixture.worker(2, echo_or_fail()).await?;
    let input = Bytes::from_static(b"\x00round trip \xff bytes");
    let outcome = fixture.dispatch(request(input.clone(), TIMEOUT)).await?;
    ensure!(
        outcome == ActivityOutcome::Completed(input),
        "an echo came back as {outcome:?}"
    );
    let outcome = fixture
        .dispatch(request(&b"fail:disk full"[..], TIMEOUT))
        .await?;
    let expected = ActivityOutcome::Failed {
        message: "disk full".to_owned(),
        retryable: true,
    };
    ensure!(
        outcome == expected,
        "a handler failure came back as {outcome:?}, expected {expected:?}"
    );
    ensure!(
        probe.calls() == 2,
        "two dispatches made {} handler calls",
        probe.calls()
    );
    Ok(())
}

pub(super) async fn capacity_under_burst<H: TransportHarness>(fixture: Fixture<'_, H>) -> Verdict {
    const CAPACITY: usize = 3;
    const BURST: usize = 4 * CAPACITY;
    // Each handler holds until the worker has once run CAPACITY at the same time, so the
    // burst provably fills the worker; a transport that over-delivers shows a higher peak.
    let probe = Probe::new();
    let gate = probe.clone();
    let handler = Handler::new(move |call: TaskCall| {
        let gate = gate.clone();
        async move {
            gate.peak_reaches(CAPACITY, STEP).await;
            tokio::task::yield_now().await;
            TaskResult::Success(call.input)
        }
    });
    let worker = fixture
        .worker_with(CAPACITY as u32, &probe, handler)
        .await?;
    // The slots the gateway grants are the slots the worker was configured with; a transport
    // that advertises more lets the gateway over-deliver whenever the burst's timing allows it.
    let advertised = fixture
        .core
        .registry()
        .worker(worker.worker_id())
        .and_then(|snapshot| snapshot.capacity);
    ensure!(
        advertised == Some(CAPACITY as u32),
        "the worker advertised capacity {advertised:?} to the gateway when configured with \
         {CAPACITY}"
    );
    let burst: Vec<_> = (0..BURST)
        .map(|i| fixture.spawn_dispatch(request(format!("burst {i}"), TIMEOUT)))
        .collect();
    for (i, dispatch) in burst.into_iter().enumerate() {
        let outcome = join(dispatch).await?;
        ensure!(
            outcome == ActivityOutcome::Completed(Bytes::from(format!("burst {i}"))),
            "burst dispatch {i} ended {outcome:?}"
        );
    }
    ensure!(
        probe.peak() <= CAPACITY,
        "the worker ran {} handlers at once with capacity {CAPACITY}",
        probe.peak()
    );
    ensure!(
        probe.peak() == CAPACITY,
        "a burst of {BURST} never filled capacity {CAPACITY} (peak {}): tasks are not delivered \
         concurrently",
        probe.peak()
    );
    ensure!(
        probe.calls() == BURST,
        "{BURST} dispatches made {} handler calls",
        probe.calls()
    );
    Ok(())
}

pub(super) async fn round_robin<H: TransportHarness>(fixture: Fixture<'_, H>) -> Verdict {
    let log: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let tagged = |tag: &'static str| {
        let log = Arc::clone(&log);
        Handler::new(move |call: TaskCall| {
            log.lock().unwrap_or_else(PoisonError::into_inner).push(tag);
            async move { TaskResult::Success(call.input) }
        })
    };
    let (_a, _) = fixture.worker(4, tagged("a")).await?;
    let (_b, _) = fixture.worker(4, tagged("b")).await?;
    for i in 0..6 {
        let outcome = fixture
            .dispatch(request(format!("rr {i}"), TIMEOUT))
            .await?;
        ensure!(
            matches!(outcome, ActivityOutcome::Completed(_)),
            "dispatch {i} ended {outcome:?}"
        );
    }
    let order = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    ensure!(
        order.len() == 6 && order.windows(2).all(|pair| pair[0] != pair[1]),
        "six sequential dispatches over two idle workers ran as {order:?}, not alternating"
    );
    Ok(())
}

pub(super) async fn exactly_one_outcome<H: TransportHarness>(fixture: Fixture<'_, H>) -> Verdict {
    const DISPATCHES: usize = 64;
    let (_a, a) = fixture.worker(3, Handler::echo()).await?;
    let (_b, b) = fixture.worker(2, Handler::echo()).await?;
    let all: Vec<_> = (0..DISPATCHES)
        .map(|i| fixture.spawn_dispatch(request(format!("unique input {i}"), TIMEOUT)))
        .collect();
    for (i, dispatch) in all.into_iter().enumerate() {
        let outcome = join(dispatch).await?;
        let expected = ActivityOutcome::Completed(Bytes::from(format!("unique input {i}")));
        ensure!(
            outcome == expected,
            "dispatch {i} ended {outcome:?}, expected its own input back"
        );
    }
    ensure!(
        a.calls() + b.calls() == DISPATCHES,
        "{DISPATCHES} dispatches made {} handler calls",
        a.calls() + b.calls()
    );
    let refused = fixture.core.dispatcher().refused();
    ensure!(
        refused == crate::RefusedCounts::default(),
        "core refused results the transport handed in: {refused:?}"
    );
    ensure!(
        fixture.core.dispatcher().pending_tasks() == 0,
        "{} tasks are still pending after every dispatch ended",
        fixture.core.dispatcher().pending_tasks()
    );
    Ok(())
}
