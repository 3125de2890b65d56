//! Workers lost without a goodbye: frozen (connection open, nobody reading), severed, and let
//! go by core.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::cancel::until_cancelled;
use crate::delivery::WorkerDelivery;
use crate::eligibility::DispatchExclusion;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::outcome::ActivityOutcome;
use crate::testkit::fixture::{Fixture, STEP, Verdict, ensure, join, request};
use crate::testkit::handler::Handler;
use crate::testkit::harness::{ConformanceWorker, TransportHarness};

const TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn frozen_worker_excluded<H: TransportHarness>(
    mut fixture: Fixture<'_, H>,
) -> Verdict {
    let (frozen, frozen_probe) = fixture.worker(2, Handler::echo()).await?;
    let (healthy, healthy_probe) = fixture.worker(2, Handler::echo()).await?;
    let frozen_id = frozen.worker_id();
    frozen.freeze();
    ensure!(
        fixture
            .wait_event(|event| matches!(event, WorkerEvent::Excluded {
                worker,
                exclusion: DispatchExclusion::ReachabilityLost,
            } if *worker == frozen_id))
            .await,
        "a frozen worker was not marked unreachable within {STEP:?}"
    );
    for i in 0..4 {
        let outcome = fixture
            .dispatch(request(format!("live {i}"), TIMEOUT))
            .await?;
        ensure!(
            matches!(outcome, ActivityOutcome::Completed(_)),
            "with one worker frozen, dispatch {i} ended {outcome:?}"
        );
    }
    ensure!(
        frozen_probe.calls() == 0 && healthy_probe.calls() == 4,
        "an unreachable worker was still selected ({} frozen, {} healthy handler calls)",
        frozen_probe.calls(),
        healthy_probe.calls()
    );
    ensure!(
        fixture
            .wait_event(|event| matches!(event, WorkerEvent::Disconnected {
                worker,
                reason: DisconnectReason::Timeout,
            } if *worker == frozen_id))
            .await,
        "a frozen worker was not deregistered for silence within {STEP:?}"
    );
    ensure!(
        fixture.registry().is_registered(healthy.worker_id()),
        "the healthy worker was deregistered along with the frozen one"
    );
    Ok(())
}

pub(super) async fn severed_worker_redispatched<H: TransportHarness>(
    mut fixture: Fixture<'_, H>,
) -> Verdict {
    let (severed, severed_probe) = fixture.worker(1, until_cancelled()).await?;
    let severed_id = severed.worker_id();
    let running = fixture.spawn_dispatch(request("survive the loss", TIMEOUT));
    ensure!(
        severed_probe.calls_reach(1, STEP).await,
        "the dispatch never reached the first worker"
    );
    let (_rescuer, rescuer_probe) = fixture.worker(1, Handler::echo()).await?;
    severed.sever();
    let outcome = join(running).await?;
    ensure!(
        outcome == ActivityOutcome::Completed(Bytes::from_static(b"survive the loss")),
        "a task whose worker was severed ended {outcome:?}, not completed by another worker"
    );
    ensure!(
        rescuer_probe.calls() == 1,
        "the second worker ran {} tasks, expected the re-dispatched one",
        rescuer_probe.calls()
    );
    ensure!(
        fixture
            .wait_event(|event| matches!(event,
                WorkerEvent::Disconnected { worker, .. } if *worker == severed_id))
            .await,
        "the severed worker was never deregistered"
    );
    Ok(())
}

/// Core deregisters a worker exactly as the liveness prober does on a timeout; the transport
/// must close that worker's connection (its delivery leg reports closed), and only that one.
pub(super) async fn deregistered_worker_disconnected<H: TransportHarness>(
    fixture: Fixture<'_, H>,
) -> Verdict {
    let (timed_out, _) = fixture.worker(1, Handler::echo()).await?;
    let (staying, _) = fixture.worker(1, Handler::echo()).await?;
    let id = timed_out.worker_id();
    let leg = |worker| {
        fixture
            .registry()
            .worker(worker)
            .map(|snapshot| Arc::clone(snapshot.worker.delivery()))
    };
    let (Some(timed_out_leg), Some(staying_leg)) = (leg(id), leg(staying.worker_id())) else {
        return Err("an admitted worker was not registered".to_owned());
    };
    ensure!(
        fixture.registry().deregister(id, DisconnectReason::Timeout),
        "worker {id} was not registered when core let it go"
    );
    ensure!(
        closes_within(timed_out_leg.as_ref(), STEP).await,
        "the connection of worker {id}, deregistered by core (timeout), was still open after \
         {STEP:?}; the transport must close it when the registration token reports the departure"
    );
    ensure!(
        staying_leg.is_connected() && fixture.registry().is_registered(staying.worker_id()),
        "closing the deregistered worker's connection closed another worker's too"
    );
    Ok(())
}

/// Whether `leg` reports closed within `limit`. A delivery leg has no close notification,
/// so this looks every few milliseconds, a bounded number of times.
async fn closes_within(leg: &dyn WorkerDelivery, limit: Duration) -> bool {
    const LOOK_EVERY: Duration = Duration::from_millis(5);
    let looks = limit.as_millis() / LOOK_EVERY.as_millis();
    for _ in 0..looks {
        if !leg.is_connected() {
            return true;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    !leg.is_connected()
}
