//! A worker whose link breaks while it runs a task: it resumes and delivers that task's result
//! (a transport with sessions), or it is deregistered at once and the task moves (without).

use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::address::WorkerId;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::outcome::{ActivityOutcome, TaskResult};
use crate::testkit::fixture::{
    Fixture, STEP, Verdict, ensure, join, request, session_registration,
};
use crate::testkit::handler::{Handler, TaskCall};
use crate::testkit::harness::{ConformanceWorker, TransportHarness};
use crate::testkit::probe::Probe;

const TIMEOUT: Duration = Duration::from_secs(20);

/// Events about one worker the check reads before giving up; far above what a resume causes.
const EVENTS: usize = 64;

/// Holds every task until `release` fires (or the task is cancelled), then answers `kept:`
/// and its input, so the outcome says which worker produced it.
fn hold(release: CancellationToken) -> Handler {
    Handler::new(move |call: TaskCall| {
        let release = release.clone();
        async move {
            let released = tokio::select! {
                () = release.cancelled() => true,
                () = call.cancelled.cancelled() => false,
                () = tokio::time::sleep(TIMEOUT) => false,
            };
            if released {
                TaskResult::Success(Bytes::from([&b"kept: "[..], &call.input[..]].concat()))
            } else {
                TaskResult::Failure {
                    message: "let go before release".to_owned(),
                    retryable: true,
                }
            }
        }
    })
}

pub(super) async fn resume_keeps_tasks<H: TransportHarness>(
    mut fixture: Fixture<'_, H>,
) -> Verdict {
    let release = CancellationToken::new();
    // Released however the check ends, so no handler outlives it.
    let _release_on_exit = release.clone().drop_guard();
    let kept_probe = Probe::new();
    let kept = fixture
        .registered_worker(session_registration(1), &kept_probe, hold(release.clone()))
        .await?;
    let id = kept.worker_id();
    let running = fixture.spawn_dispatch(request("across the break", TIMEOUT));
    ensure!(
        kept_probe.calls_reach(1, STEP).await,
        "the dispatch never reached the first worker"
    );
    let (rescuer, rescuer_probe) = fixture.worker(1, Handler::echo()).await?;
    kept.break_link();
    if fixture.supports_resume() {
        resumes(&mut fixture, id, &kept_probe, &rescuer_probe).await?;
        ensure!(
            !running.is_finished(),
            "the dispatch ended while its worker's link was down: {:?}",
            join(running).await
        );
        release.cancel();
        let outcome = join(running).await?;
        ensure!(
            outcome == ActivityOutcome::Completed(Bytes::from_static(b"kept: across the break")),
            "the task held across the break ended {outcome:?}, not with the resumed worker's \
             result: it was dispatched again ({} calls on the other worker, {} on the resumed \
             one)",
            rescuer_probe.calls(),
            kept_probe.calls()
        );
        ran_once(&fixture, &kept_probe, &rescuer_probe)?;
        takes_new_work(&fixture, id, &kept_probe, rescuer.worker_id()).await
    } else {
        falls_back(&mut fixture, id).await?;
        let outcome = join(running).await?;
        ensure!(
            outcome == ActivityOutcome::Completed(Bytes::from_static(b"across the break")),
            "without sessions, a task whose worker's link broke ended {outcome:?}, not completed \
             by the other worker"
        );
        ensure!(
            rescuer_probe.calls() == 1,
            "without sessions, the other worker ran {} tasks, expected the re-dispatched one",
            rescuer_probe.calls()
        );
        Ok(())
    }
}

/// The broken worker comes back as itself: `Resumed` for the same id (after `Suspended`, if
/// the gateway noticed the loss before the new connection arrived), never `Disconnected`, and
/// nothing moved to the other worker meanwhile.
async fn resumes<H: TransportHarness>(
    fixture: &mut Fixture<'_, H>,
    id: WorkerId,
    kept: &Probe,
    rescuer: &Probe,
) -> Verdict {
    let mut resumed = false;
    for _ in 0..EVENTS {
        match fixture.next_event_of(id).await {
            Some(WorkerEvent::Resumed { .. }) => {
                resumed = true;
                break;
            }
            Some(WorkerEvent::Disconnected { reason, .. }) => {
                return Err(format!(
                    "worker {id} was deregistered ({}) when its link broke, instead of \
                     being suspended until it resumed; the harness declares resume supported: \
                     does its gateway grant the session the worker asked for \
                     (registration.reconnect_grace), and does its worker resume it?",
                    reason.as_str()
                ));
            }
            Some(_) => {}
            None => break,
        }
    }
    ensure!(
        resumed,
        "worker {id} did not resume its session within {STEP:?} of its link breaking"
    );
    ensure!(
        rescuer.calls() == 0 && kept.calls() == 1,
        "while worker {id} was away its task was dispatched again ({} calls on the other \
         worker, {} on the resumed one): the resume lost track of the task it was running",
        rescuer.calls(),
        kept.calls()
    );
    Ok(())
}

/// The task ran once, on the resumed worker, and its result was applied once.
fn ran_once<H: TransportHarness>(
    fixture: &Fixture<'_, H>,
    kept: &Probe,
    rescuer: &Probe,
) -> Verdict {
    ensure!(
        kept.calls() == 1 && rescuer.calls() == 0,
        "the task held across the break ran {} times on the resumed worker and {} on the other",
        kept.calls(),
        rescuer.calls()
    );
    let refused = fixture.core.dispatcher().refused();
    ensure!(
        refused == crate::RefusedCounts::default(),
        "core refused results after the resume (a result sent twice, or for a task let go): \
         {refused:?}"
    );
    Ok(())
}

/// Two sequential dispatches over the two idle workers alternate, so one reaches the resumed
/// worker: its new connection carries new tasks as well as the held one's result.
async fn takes_new_work<H: TransportHarness>(
    fixture: &Fixture<'_, H>,
    id: WorkerId,
    kept: &Probe,
    rescuer: WorkerId,
) -> Verdict {
    fixture.wait_eligible(id).await?;
    for i in 0..2 {
        let outcome = fixture
            .dispatch(request(format!("after resume {i}"), TIMEOUT))
            .await?;
        ensure!(
            matches!(outcome, ActivityOutcome::Completed(_)),
            "dispatch {i} after the resume ended {outcome:?}"
        );
    }
    ensure!(
        kept.calls() == 2,
        "two dispatches after the resume never reached resumed worker {id} (the other worker \
         {rescuer} ran them)"
    );
    ensure!(
        fixture.core.dispatcher().pending_tasks() == 0,
        "{} tasks are still pending after every dispatch ended",
        fixture.core.dispatcher().pending_tasks()
    );
    Ok(())
}

/// Without sessions the broken worker leaves at once, as `Disconnect`, never suspended.
async fn falls_back<H: TransportHarness>(fixture: &mut Fixture<'_, H>, id: WorkerId) -> Verdict {
    for _ in 0..EVENTS {
        match fixture.next_event_of(id).await {
            Some(WorkerEvent::Disconnected {
                reason: DisconnectReason::Disconnect,
                ..
            }) => return Ok(()),
            Some(WorkerEvent::Disconnected { reason, .. }) => {
                return Err(format!(
                    "worker {id}, whose link broke, left as {}, expected disconnect",
                    reason.as_str()
                ));
            }
            Some(event @ (WorkerEvent::Suspended { .. } | WorkerEvent::Resumed { .. })) => {
                return Err(format!(
                    "worker {id} was suspended or resumed ({event:?}) but the harness declares \
                     resume unsupported: declare it (TransportHarness::supports_resume), or \
                     give a worker no session unless it asks for one"
                ));
            }
            Some(_) => {}
            None => break,
        }
    }
    Err(format!(
        "worker {id}, whose link broke, was not deregistered within {STEP:?}"
    ))
}
