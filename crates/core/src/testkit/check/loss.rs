//! Workers lost without a goodbye: frozen (connection open, nobody reading) and severed.

use std::time::Duration;

use bytes::Bytes;

use super::cancel::until_cancelled;
use crate::eligibility::DispatchExclusion;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::outcome::ActivityOutcome;
use crate::testkit::fixture::{Fixture, STEP, Verdict, ensure, join, request};
use crate::testkit::handler::Handler;
use crate::testkit::harness::{TransportHarness, WorkerHandle};

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
