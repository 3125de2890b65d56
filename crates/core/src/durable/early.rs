//! A durable dispatch delivered while its record commits.
//!
//! A durable `Dispatch` (or `DispatchStream` item) tells its producer nothing before the
//! outcome, so only the outcome has to wait for the record: the task goes to a worker while
//! the record commits, and the outcome is recorded behind it (a store that
//! [orders its writes](super::DispatchStore::orders_writes) commits both in one batch when the
//! worker is quick) and announced once both are committed. A record the store refuses cancels
//! the dispatch, and no outcome is announced: the caller hears the refusal. Only for a dispatch
//! without an idempotency key: a repeated key must run nothing.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;

use super::dispatcher::{DriverRunning, Submitted};
use super::driver::{record as record_outcome, run_dispatch};
use super::live::Live;
use super::record::{NewDispatch, Recorded};
use super::store::DispatchStoreError;

/// Runs `first` and `second` on this task, polling `first` first every time both are woken
/// (a store that orders its writes then sees `second`'s write after `first`'s), until both
/// end; or until `first` ends with an output `stops` accepts, when `second` is dropped
/// unfinished (`None`).
async fn in_order<A: Future, B: Future>(
    first: A,
    second: B,
    stops: impl Fn(&A::Output) -> bool,
) -> (A::Output, Option<B::Output>) {
    let (mut first, mut second) = (pin!(first), pin!(second));
    let (mut a, mut b) = (None, None);
    std::future::poll_fn(|cx| {
        if a.is_none()
            && let Poll::Ready(out) = first.as_mut().poll(cx)
        {
            a = Some(out);
        }
        match a.take() {
            Some(out) if stops(&out) => return Poll::Ready((out, None)),
            other => a = other,
        }
        if b.is_none()
            && let Poll::Ready(out) = second.as_mut().poll(cx)
        {
            b = Some(out);
        }
        match (a.take(), b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, Some(b))),
            (got_a, got_b) => {
                a = got_a;
                b = got_b;
                Poll::Pending
            }
        }
    })
    .await
}

/// What the store answered to the record.
type RecordResult = Result<Recorded, DispatchStoreError>;

/// Whether `recorded` recorded the dispatch `dispatch` (a retry of the same id counts).
fn is_recorded(recorded: &RecordResult, dispatch: &NewDispatch) -> bool {
    match recorded {
        Ok(Recorded::New(_)) => true,
        Ok(Recorded::Existing(id)) => *id == dispatch.id,
        Err(_) => false,
    }
}

/// Records `dispatch` and, when `early`, runs it meanwhile; tells `submitted` how the record
/// went, then records and announces the outcome (or, refused, ends it unannounced).
pub(super) async fn record_while_running(
    running: DriverRunning,
    dispatch: NewDispatch,
    live: Arc<Live>,
    early: bool,
    submitted: oneshot::Sender<Result<Submitted, DispatchStoreError>>,
) {
    let shared = &running.0;
    // Delivered early, it is shared with the store's writer, which may hold the record back
    // for the outcome (no copy of the task); otherwise the store is handed a copy.
    let dispatch = Arc::new(dispatch);
    let mut recording = if early {
        shared.store.record_before_outcome(Arc::clone(&dispatch))
    } else {
        shared.store.record(NewDispatch::clone(&dispatch))
    };
    // Polled once before the task can reach a worker: the store queues the record ahead of
    // the notes and the outcome that follow.
    let mut recorded: Option<RecordResult> = None;
    if let Poll::Ready(result) =
        std::future::poll_fn(|cx| Poll::Ready(recording.as_mut().poll(cx))).await
    {
        recorded = Some(result);
    }
    if !early && recorded.is_none() {
        recorded = Some(recording.as_mut().await);
    }
    let mut submitted = Some(submitted);
    let mut tell = |recorded: &RecordResult| {
        if let Some(submitted) = submitted.take() {
            let answer = match recorded {
                Ok(recorded) => Ok(Submitted {
                    id: recorded.id().clone(),
                    existing: false,
                }),
                Err(error) => Err(error.clone()),
            };
            let _ = submitted.send(answer);
        }
    };
    if let Some(result) = &recorded {
        tell(result);
        if !is_recorded(result, &dispatch) {
            shared.live.finish(&dispatch.id, None);
            return;
        }
    }
    let id = &dispatch.id;
    // In a block of its own, so the run's state (the dispatch future, kilobytes) shares its
    // room in this task with the outcome's record below instead of adding to it: the task is
    // copied whole when spawned.
    let outcome = {
        let mut dispatch_run = pin!(run_dispatch(shared, &dispatch, 0, &live));
        loop {
            tokio::select! {
                biased;
                result = recording.as_mut(), if recorded.is_none() => {
                    tell(&result);
                    if !is_recorded(&result, &dispatch) {
                        // Refused: the caller hears the refusal; a worker that has it is told
                        // to stop, and its outcome is not recorded.
                        live.cancel.cancel();
                    }
                    recorded = Some(result);
                }
                outcome = &mut dispatch_run => break outcome,
            }
        }
    };
    // The outcome is sent to the store now, behind the record, which may still be committing.
    // A refused record has no row to record it in: the outcome is not sent, or its write (which
    // may be retrying a failing store) is given up, so the caller hears the refusal at once.
    let refused = |recorded: &RecordResult| !is_recorded(recorded, &dispatch);
    let (recorded, stood) = match (outcome, recorded) {
        (Some(_), Some(result)) if refused(&result) => (result, None),
        (Some(outcome), recorded) => {
            let recording = async {
                match recorded {
                    Some(result) => result,
                    None => recording.await,
                }
            };
            let (recorded, stood) =
                in_order(recording, record_outcome(shared, id, outcome), refused).await;
            (recorded, stood.flatten())
        }
        (None, recorded) => {
            let recorded = match recorded {
                Some(result) => result,
                None => recording.await,
            };
            if is_recorded(&recorded, &dispatch) {
                // As any driver stopped by a shutdown: it runs again at the next start.
                if let Err(error) = shared.store.release(id, Duration::ZERO).await {
                    tracing::debug!(%error, "release at shutdown not recorded");
                }
            }
            (recorded, None)
        }
    };
    tell(&recorded);
    if is_recorded(&recorded, &dispatch) {
        shared.announce(&dispatch.principal, id, stood);
    } else {
        shared.live.finish(id, None);
    }
}
