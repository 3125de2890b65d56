//! The driver of one durable dispatch: runs it through the one dispatcher, keeps the store's
//! row in step (parked, running), and records its one outcome.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::Instrument;

use super::dispatcher::{DriverRunning, Shared};
use super::live::Live;
use super::notes::{Note, Notes};
use super::record::{
    Completion, DispatchId, DispatchState, NewDispatch, OutcomeRecord, StoredDispatch,
};
use crate::backoff::Backoff;
use crate::dispatcher::DispatchHooks;
use crate::outcome::{ActivityOutcome, ActivityRequest};
use crate::registration::CallerIdentity;
use crate::registry::UnservedReason;
use crate::role::Role;

/// Pauses between attempts to record an outcome while the store fails.
const RECORD_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(50),
    max: Duration::from_secs(5),
};

/// How often a running dispatch's claim is extended ([`DispatchStore::extend`]), in a store
/// that [leases claims](super::DispatchStore::leases_claims).
///
/// [`DispatchStore::extend`]: super::DispatchStore::extend
const EXTEND_EVERY: Duration = Duration::from_secs(30);

/// A note write being made.
type Writing<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Runs `writing` to its end, or waits for ever when there is none.
async fn run_some(writing: &mut Option<Writing<'_>>) {
    match writing {
        Some(writing) => writing.await,
        None => std::future::pending().await,
    }
}

/// Polls `writing` once and lets it go: a note the store takes at once is written, one it
/// would make the caller wait for is dropped.
fn offer_once(writing: Option<Writing<'_>>) {
    if let Some(mut writing) = writing {
        let mut once = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = writing.as_mut().poll(&mut once);
    }
}

/// The outcome of a dispatch a restart finds past its deadline at `now`; `None` while it
/// still has time. One that a worker ever held timed out; one no worker took is unserved.
pub(super) fn expired(row: &StoredDispatch, now: SystemTime) -> Option<ActivityOutcome> {
    if now < row.dispatch.deadline {
        return None;
    }
    let held = row.attempts > 0 || matches!(row.state, DispatchState::Running { .. });
    Some(if held {
        ActivityOutcome::TimedOut
    } else {
        ActivityOutcome::Unserved {
            reason: UnservedReason::NoWorkers,
            detail: "the gateway restarted after the dispatch's deadline had passed; no \
                     worker took it"
                .to_owned(),
        }
    })
}

/// Runs `row` to its one outcome and records it; `resumed` for a row found at start (its
/// deadline may have passed meanwhile).
pub(super) async fn drive(
    running: DriverRunning,
    row: StoredDispatch,
    live: Arc<Live>,
    resumed: bool,
) {
    let id = row.dispatch.id.clone();
    let span = tracing::info_span!("durable_dispatch", dispatch_id = %id,
        namespace = %row.dispatch.namespace, activity_type = %row.dispatch.activity_type);
    async move {
        let shared = &running.0;
        match run(shared, &row, &live, resumed).await {
            Some(outcome) => {
                let recorded = record(shared, &id, outcome).await;
                shared.announce(&row.dispatch.principal, &id, recorded);
            }
            None => {
                // Not an outcome: the gateway is going away, the dispatch resumes at the next
                // start. Losing this release costs nothing a restart does not redo.
                if let Err(error) = shared.store.release(&id, Duration::ZERO).await {
                    tracing::debug!(%error, "release at shutdown not recorded");
                }
                shared.live.finish(&id, None);
            }
        }
    }
    .instrument(span)
    .await;
}

/// The dispatch's outcome to record, or `None` when it ended because the gateway stops.
pub(super) async fn run(
    shared: &Shared,
    row: &StoredDispatch,
    live: &Live,
    resumed: bool,
) -> Option<ActivityOutcome> {
    let now = SystemTime::now();
    if resumed && let Some(outcome) = expired(row, now) {
        tracing::info!(
            outcome = outcome.label(),
            "deadline passed while the gateway was down"
        );
        return Some(outcome);
    }
    if let DispatchState::Queued {
        not_before: Some(at),
    } = row.state
        && let Ok(delay) = at.duration_since(now)
    {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = live.cancel.cancelled() => return Some(ActivityOutcome::Cancelled),
            () = shared.stopping.cancelled() => return None,
        }
    }
    run_dispatch(shared, &row.dispatch, row.attempts, live).await
}

/// Runs `d`, delivered `attempts` times before, through the one dispatcher to its outcome,
/// keeping its row in step; `None` when it ended because the gateway stops.
pub(super) async fn run_dispatch(
    shared: &Shared,
    d: &NewDispatch,
    attempts: u32,
    live: &Live,
) -> Option<ActivityOutcome> {
    if live.cancel.is_cancelled() {
        return Some(ActivityOutcome::Cancelled);
    }
    let request = ActivityRequest {
        namespace: d.namespace.clone(),
        task_queue: d.task_queue.clone(),
        activity_type: d.activity_type.clone(),
        node: d.node.clone(),
        input: d.input.clone(),
        activity_id: None,
        timeout: d
            .deadline
            .duration_since(SystemTime::now())
            .unwrap_or_default(),
    };
    // The grant was checked when the dispatch was submitted; it runs as its principal.
    let caller = CallerIdentity::granted(d.principal.clone(), [d.namespace.clone()])
        .with_roles([Role::Producer]);
    let notes = Arc::new(Notes::default());
    let hooks = hooks(attempts, live, &notes);
    let mut dispatch = pin!(shared.dispatcher.dispatch_with(&caller, request, hooks));
    // While a worker holds it, its claim is kept alive for stores that lease claims; the one
    // timer is registered only when it is first polled, so other stores never arm it.
    let leases_claims = shared.store.leases_claims();
    let mut extend = pin!(tokio::time::sleep(EXTEND_EVERY));
    let mut extending = false;
    // One note is written at a time, in order, while the dispatch goes on: a worker's answer
    // never waits for the store to take a note.
    let mut writing: Option<Writing<'_>> = None;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut dispatch => break result,
            () = run_some(&mut writing), if writing.is_some() => writing = None,
            note = notes.next(), if writing.is_none() => {
                extending = leases_claims && matches!(note, Note::Delivered(..));
                if extending {
                    extend.as_mut().reset(Instant::now() + EXTEND_EVERY);
                }
                live.set_state(note.state());
                writing = Some(Box::pin(write(shared, &d.id, note)));
            }
            () = extend.as_mut(), if extending => {
                extend.as_mut().reset(Instant::now() + EXTEND_EVERY);
                if let Err(error) = shared.store.extend(&d.id).await {
                    tracing::debug!(%error, "claim not extended");
                }
            }
        }
    };
    let outcome = match result {
        Ok(ActivityOutcome::ShuttingDown) => None,
        Ok(outcome) => Some(outcome),
        // Accepted, so it ends with an outcome: the refusal's sentence, final.
        Err(refusal) => Some(ActivityOutcome::Failed {
            message: refusal.to_string(),
            retryable: false,
        }),
    };
    if outcome.is_some() {
        // Finished: its state notes matter no more, and its outcome does not wait for them
        // (a store ignores a note that lands after the outcome). The last delivery's claim is
        // still offered to the store once, in order, without waiting: the outcome can come
        // back before the loop above took (or started) the claim, and a store that takes it
        // at once (an in-memory one, SQLite's queue) then still counts that delivery.
        offer_once(writing);
        if let Some(claim) = notes.take_last_delivered() {
            offer_once(Some(Box::pin(write(shared, &d.id, claim))));
        }
        return outcome;
    }
    // Not finished: the last delivery's claim still counts, or the next start would repeat
    // its attempt number.
    if let Some(writing) = writing {
        writing.await;
    }
    while let Some(note) = notes.try_next() {
        write(shared, &d.id, note).await;
    }
    None
}

fn hooks(attempts: u32, live: &Live, notes: &Arc<Notes>) -> DispatchHooks {
    let (delivered, parked) = (Arc::clone(notes), Arc::clone(notes));
    DispatchHooks {
        attempt_offset: attempts,
        on_delivered: Some(Arc::new(move |worker, attempt| {
            delivered.push(Note::Delivered(worker, attempt));
        })),
        on_parked: Some(Arc::new(move |reason| {
            parked.push(Note::Parked(reason));
        })),
        durable: true,
        cancel: Some(live.cancel.clone()),
        local_only: false,
    }
}

/// Writes a note to the store. A lost note costs a stale state or a repeated attempt number
/// after a crash, never an outcome: it is logged and dropped.
async fn write(shared: &Shared, id: &DispatchId, note: Note) {
    let written = match note {
        Note::Parked(reason) => shared.store.park(id, reason.as_str()).await,
        Note::Delivered(worker, attempt) => shared.store.claim(id, worker, attempt).await,
    };
    if let Err(error) = written {
        tracing::debug!(%error, "dispatch state not written to the store");
    }
}

/// Records `outcome` as `id`'s one outcome, retrying while the store fails; returns the
/// outcome that stands (the first one recorded), or `None` when the gateway stopped before it
/// could be recorded (the dispatch then runs again after the restart).
pub(super) async fn record(
    shared: &Shared,
    id: &DispatchId,
    outcome: ActivityOutcome,
) -> Option<ActivityOutcome> {
    let stored = OutcomeRecord::from(&outcome);
    let mut failures: u32 = 0;
    loop {
        match shared.store.complete(id, &stored, SystemTime::now()).await {
            Ok(Completion::Recorded) => {
                tracing::debug!(outcome = outcome.label(), "outcome recorded");
                return Some(outcome);
            }
            Ok(Completion::AlreadyFinished(first)) => {
                tracing::debug!(kind = %first.kind, "an outcome was already recorded");
                return Some(first.to_outcome().unwrap_or(outcome));
            }
            Ok(Completion::Unknown) => {
                tracing::warn!(
                    outcome = outcome.label(),
                    "outcome not recorded: the dispatch is no longer in the store"
                );
                return Some(outcome);
            }
            Err(error) => {
                if shared.stopping.is_cancelled() {
                    tracing::warn!(%error,
                        "outcome not recorded before shutdown; the dispatch runs again after the restart");
                    return None;
                }
                tracing::warn!(%error, failures, "outcome not recorded yet; retrying");
                let pause = RECORD_BACKOFF.delay(failures, &mut rand::rng());
                failures = failures.saturating_add(1);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = shared.stopping.cancelled() => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::durable::{DispatchId, NewDispatch};

    fn row(state: DispatchState, attempts: u32, deadline: SystemTime) -> StoredDispatch {
        StoredDispatch {
            dispatch: NewDispatch {
                id: DispatchId::generate(),
                namespace: "ns".into(),
                task_queue: "q".into(),
                activity_type: "a".into(),
                node: None,
                input: Bytes::new(),
                principal: "p".into(),
                idempotency_key: None,
                submitted_at: deadline - Duration::from_secs(10),
                deadline,
            },
            state,
            attempts,
        }
    }

    #[test]
    fn a_restart_past_the_deadline_says_timed_out_for_a_dispatch_a_worker_ever_held() {
        let deadline = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let after = deadline + Duration::from_secs(1);
        let queued = DispatchState::Queued { not_before: None };
        let parked = DispatchState::Parked {
            reason: "no_workers".into(),
        };
        let running = DispatchState::Running {
            worker: crate::WorkerId::from_raw(1),
            attempt: 1,
        };
        // Held once, then back in the queue or parked (its worker lost): timed out.
        assert_eq!(
            expired(&row(queued.clone(), 1, deadline), after),
            Some(ActivityOutcome::TimedOut)
        );
        assert_eq!(
            expired(&row(parked.clone(), 2, deadline), after),
            Some(ActivityOutcome::TimedOut)
        );
        assert_eq!(
            expired(&row(running.clone(), 1, deadline), after),
            Some(ActivityOutcome::TimedOut)
        );
        // Never held: unserved, saying so.
        for never in [queued.clone(), parked] {
            match expired(&row(never, 0, deadline), after) {
                Some(ActivityOutcome::Unserved { reason, detail }) => {
                    assert_eq!(reason, UnservedReason::NoWorkers);
                    assert!(detail.contains("no worker took it"), "{detail}");
                }
                other => panic!("expected unserved: {other:?}"),
            }
        }
        // Control: with time left, nothing is decided.
        assert_eq!(
            expired(
                &row(queued, 1, deadline),
                deadline - Duration::from_millis(1)
            ),
            None
        );
        assert_eq!(
            expired(
                &row(running, 1, deadline),
                deadline - Duration::from_millis(1)
            ),
            None
        );
    }
}
