//! Cancels and deadlines travel to the worker holding the task and reach its handler.

use std::time::Duration;

use crate::eligibility::Eligibility;
use crate::outcome::{ActivityOutcome, TaskResult};
use crate::testkit::fixture::{Fixture, NAMESPACE, STEP, Verdict, ensure, join, producer, request};
use crate::testkit::handler::{Handler, TaskCall};
use crate::testkit::harness::{ConformanceWorker, TransportHarness};

const ACTIVITY_ID: &str = "conformance-cancel";

/// Runs until its task is cancelled (or the kit's step limit passes).
pub(super) fn until_cancelled() -> Handler {
    Handler::new(|call: TaskCall| async move {
        let _ = tokio::time::timeout(STEP, call.cancelled.cancelled()).await;
        TaskResult::Failure {
            message: "stopped".to_owned(),
            retryable: false,
        }
    })
}

pub(super) async fn reaches_handler<H: TransportHarness>(fixture: Fixture<'_, H>) -> Verdict {
    let (worker, probe) = fixture.worker(1, until_cancelled()).await?;
    let id = worker.worker_id();

    let mut cancelled = request("cancel me", Duration::from_secs(30));
    cancelled.activity_id = Some(ACTIVITY_ID.to_owned());
    let running = fixture.spawn_dispatch(cancelled);
    ensure!(
        probe.calls_reach(1, STEP).await,
        "the dispatch never reached the handler"
    );
    let standing = fixture.registry().worker(id).map(|w| w.eligibility);
    ensure!(
        matches!(standing, Some(Eligibility::AtCapacity { .. })),
        "while its one slot runs a task the worker stands {standing:?}, not at capacity"
    );
    fixture
        .core
        .dispatcher()
        .cancel(&producer(), NAMESPACE, ACTIVITY_ID)
        .map_err(|error| format!("cancel found nothing: {error}"))?;
    let outcome = join(running).await?;
    ensure!(
        outcome == ActivityOutcome::Cancelled,
        "a cancelled dispatch ended {outcome:?}"
    );
    ensure!(
        probe.cancels_reach(1, STEP).await,
        "the cancel never reached the running handler"
    );
    // The slot comes back once the worker lets go of the cancelled task.
    fixture.wait_eligible(id).await?;

    let outcome = fixture
        .dispatch(request("time me out", Duration::from_millis(300)))
        .await?;
    ensure!(
        outcome == ActivityOutcome::TimedOut,
        "a dispatch whose deadline passed while its handler ran ended {outcome:?}"
    );
    ensure!(
        probe.calls() == 2,
        "the timed-out dispatch never reached the handler"
    );
    ensure!(
        probe.cancels_reach(2, STEP).await,
        "the deadline's cancel never reached the running handler"
    );
    fixture.wait_eligible(id).await?;
    let refused = fixture.core.dispatcher().refused();
    ensure!(
        refused.unknown == 0 && refused.foreign == 0,
        "the worker answered for tasks it did not hold: {refused:?}"
    );
    Ok(())
}
