//! [`Runner`]: how `Dispatch` and each `DispatchStream` item run, ephemeral or durable.
//!
//! An ephemeral dispatch goes straight to core's dispatcher. A durable one goes to the durable
//! dispatcher (recorded before its outcome is told; with an idempotency key, before anything
//! runs) and is awaited until its deadline, so the reply is the same one outcome
//! `AwaitOutcome` would return, and the dispatch goes on when the caller goes away (dropping
//! the await leaves its driver running).

use std::sync::Arc;
use std::time::Duration;

use futures::future::Either;
use futures::{FutureExt, TryFutureExt};

use switchyard_core::{ActivityOutcome, CallerIdentity, Dispatcher, DurableDispatcher};
use switchyard_proto::v1 as pb;
use tonic::Status;

use super::durability::DurabilityDefaults;
use super::outcome;
use crate::ops::{PoolCell, PoolHandles};

/// How long past its deadline a durable `Dispatch` waits for the outcome to be recorded: the
/// driver records `timed_out` or `unserved` at the deadline, and the write takes a commit.
const RECORD_GRACE: Duration = Duration::from_secs(5);

/// How long a durable `Dispatch` (or `DispatchStream` item) waits for its outcome: its
/// timeout, capped at `dispatch.max_timeout`, and [`RECORD_GRACE`] more.
fn durable_wait(timeout: Duration, max_timeout: Duration) -> Duration {
    timeout.min(max_timeout) + RECORD_GRACE
}

/// Runs the dispatches of `Dispatch` and `DispatchStream`.
#[derive(Clone, Debug)]
pub(crate) struct Runner {
    dispatcher: Dispatcher,
    durable: DurableDispatcher,
    durability: DurabilityDefaults,
    default_timeout: Duration,
}

impl Runner {
    /// A runner over core's `dispatcher` and the gateway's `durable` dispatcher.
    pub(crate) fn new(
        dispatcher: Dispatcher,
        durable: DurableDispatcher,
        durability: DurabilityDefaults,
        default_timeout: Duration,
    ) -> Self {
        Self {
            dispatcher,
            durable,
            durability,
            default_timeout,
        }
    }

    /// Core's dispatcher.
    pub(crate) fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Runs `wire` to its one outcome, or refuses it with the status of `Dispatch`; the
    /// outcome goes into the console's history of `wire`'s pool, `pool`
    /// ([`Runner::pool_of`]).
    ///
    /// `wire` is turned into its dispatch, and the latency clock started, when this is called
    /// rather than when the future is first polled: the future then holds the dispatch's own
    /// future and no copy of `wire` (an `async fn` keeps its arguments for its whole life, and
    /// each `DispatchStream` item's future is copied whole into the stream's set).
    pub(crate) fn run<'a>(
        &'a self,
        caller: &'a CallerIdentity,
        wire: pb::DispatchRequest,
        pool: Arc<PoolCell>,
    ) -> impl Future<Output = Result<ActivityOutcome, Status>> + 'a {
        // A combinator, not an `async` block: awaiting a captured future moves it into the
        // block's own state, a second copy.
        let started = tokio::time::Instant::now();
        self.run_to_outcome(caller, wire).map(move |result| {
            if let Ok(outcome) = &result {
                let now = tokio::time::Instant::now();
                pool.record(outcome.label(), now.saturating_duration_since(started), now);
            }
            result
        })
    }

    /// The console's history cell of `wire`'s pool, from the producer's `handles`.
    pub(crate) fn pool_of(handles: &mut PoolHandles, wire: &pb::DispatchRequest) -> Arc<PoolCell> {
        let task_queue = switchyard_core::normalise_task_queue(&wire.task_queue);
        handles.get(&wire.namespace, task_queue)
    }

    /// The future that runs `wire`: core's dispatch for an ephemeral one, the durable
    /// dispatcher's (boxed: inline, its state would make every ephemeral dispatch's future
    /// 440 bytes larger, measured in the hot-path pass, docs/benchmarks.md) for a durable one,
    /// or the refusal of an idempotency key on an ephemeral dispatch.
    fn run_to_outcome<'a>(
        &'a self,
        caller: &'a CallerIdentity,
        wire: pb::DispatchRequest,
    ) -> impl Future<Output = Result<ActivityOutcome, Status>> + 'a {
        if self.durability.durable(&wire.namespace, wire.durable) {
            return Either::Right(Box::pin(self.run_durable(caller, wire)));
        }
        if !wire.idempotency_key.is_empty() {
            return Either::Left(Either::Left(std::future::ready(Err(
                Status::invalid_argument(
                    "idempotency_key is set on an ephemeral dispatch; an idempotency key needs \
                     the dispatch store: set durable = true",
                ),
            ))));
        }
        let request = outcome::request(wire, self.default_timeout);
        Either::Left(Either::Right(
            self.dispatcher
                .dispatch(caller, request)
                .map_err(|error| outcome::refusal(&error)),
        ))
    }

    /// The durable half of [`Runner::run`].
    async fn run_durable(
        &self,
        caller: &CallerIdentity,
        wire: pb::DispatchRequest,
    ) -> Result<ActivityOutcome, Status> {
        let (request, key) = outcome::durable_request(wire, self.default_timeout);
        let wait = durable_wait(request.timeout, self.dispatcher.max_timeout());
        let (id, heard) = match key {
            // Without a key nothing is said before the outcome: the task may go to a worker
            // while its record commits.
            None => {
                let awaited = self
                    .durable
                    .dispatch(caller, request, wait)
                    .await
                    .map_err(|error| outcome::submit_refusal(&error))?;
                (awaited.id, awaited.outcome)
            }
            Some(key) => {
                let submitted = self
                    .durable
                    .submit(caller, request, Some(key))
                    .await
                    .map_err(|error| outcome::submit_refusal(&error))?;
                let heard = self
                    .durable
                    .await_outcome(caller, &submitted.id, wait)
                    .await
                    .map_err(|error| outcome::lookup_refusal(&error))?;
                (submitted.id, heard)
            }
        };
        heard.ok_or_else(|| {
            Status::unavailable(format!(
                "durable dispatch {} is recorded but has no outcome yet (the gateway is shutting \
                 down, or the store is slow to record it); it runs on, also after a restart: \
                 read its outcome with AwaitOutcome",
                id
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_durable_dispatch_waits_its_timeout_capped_at_max_timeout_and_5_s_more() {
        let max = Duration::from_secs(60);
        assert_eq!(RECORD_GRACE, Duration::from_secs(5));
        assert_eq!(
            durable_wait(Duration::from_secs(2), max),
            Duration::from_secs(7)
        );
        assert_eq!(
            durable_wait(Duration::from_secs(120), max),
            Duration::from_secs(65),
            "a timeout past dispatch.max_timeout is capped first"
        );
    }
}
