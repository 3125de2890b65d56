//! A drained worker finishes its task, takes no new one, then closes.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::eligibility::Eligibility;
use crate::events::WorkerEvent;
use crate::outcome::{ActivityOutcome, TaskResult};
use crate::registry::UnservedReason;
use crate::testkit::fixture::{Fixture, STEP, Verdict, ensure, join, request};
use crate::testkit::handler::{Handler, TaskCall};
use crate::testkit::harness::{ConformanceWorker, TransportHarness};

pub(super) async fn finishes_in_flight<H: TransportHarness>(
    mut fixture: Fixture<'_, H>,
) -> Verdict {
    let release = CancellationToken::new();
    let gate = release.clone();
    let hold = Handler::new(move |call: TaskCall| {
        let gate = gate.clone();
        async move {
            let _ = tokio::time::timeout(STEP, gate.cancelled()).await;
            TaskResult::Success(call.input)
        }
    });
    let (worker, probe) = fixture.worker(2, hold).await?;
    let id = worker.worker_id();
    let running = fixture.spawn_dispatch(request("finish me", Duration::from_secs(30)));
    ensure!(
        probe.calls_reach(1, STEP).await,
        "the dispatch never reached the handler"
    );

    ensure!(
        fixture.registry().drain_worker(id),
        "drain_worker did not find worker {id}"
    );
    let standing = fixture.registry().worker(id).map(|w| w.eligibility);
    ensure!(
        standing == Some(Eligibility::Draining),
        "a draining worker with a free slot stands {standing:?}"
    );
    let refused = fixture
        .dispatch(request("too late", Duration::from_millis(300)))
        .await?;
    ensure!(
        matches!(
            refused,
            ActivityOutcome::Unserved {
                reason: UnservedReason::Draining,
                ..
            }
        ),
        "a dispatch to a pool whose only worker drains ended {refused:?}"
    );
    ensure!(
        probe.calls() == 1,
        "a draining worker was given new work ({} handler calls)",
        probe.calls()
    );

    release.cancel();
    let outcome = join(running).await?;
    ensure!(
        outcome == ActivityOutcome::Completed(bytes::Bytes::from_static(b"finish me")),
        "the task in flight when the drain began ended {outcome:?}"
    );
    ensure!(
        fixture
            .wait_event(|event| matches!(event,
                WorkerEvent::Disconnected { worker, .. } if *worker == id))
            .await,
        "the drained worker did not close within {STEP:?} of finishing its work"
    );
    Ok(())
}
