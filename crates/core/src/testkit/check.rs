//! The checks of the shared transport contract, and the runner.

mod admission;
mod cancel;
mod drain;
mod exchange;
mod loss;
mod resume;

use std::fmt;

pub(crate) use admission::refused_caller;

use super::fixture::Fixture;
use super::harness::TransportHarness;

/// One check of the conformance kit; each runs against a fresh core and gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Check {
    /// Invalid registrations are refused by name (`namespaces`, `activity_types`,
    /// `max_concurrency`, a namespace outside the caller's grant) and register nothing.
    AdmissionRefusals,
    /// A dispatch reaches the handler and its output (or failure) comes back unchanged.
    RoundTrip,
    /// A burst never runs more handlers at once than the worker's capacity, and fills it.
    CapacityUnderBurst,
    /// Consecutive dispatches alternate between two workers.
    RoundRobin,
    /// Cancelling a dispatch, or its deadline passing, reaches the running handler.
    CancelReachesHandler,
    /// A drained worker finishes what it holds, takes nothing new, then leaves.
    DrainFinishesInFlight,
    /// A worker that stops reading is excluded from selection, then deregistered.
    FrozenWorkerExcluded,
    /// A severed worker's task is dispatched again to another worker.
    SeveredWorkerRedispatched,
    /// A worker core lets go (a liveness timeout) has its connection closed by the transport.
    DeregisteredWorkerDisconnected,
    /// Many concurrent dispatches each get exactly one outcome, their own.
    ExactlyOneOutcome,
    /// A worker whose link breaks mid-task resumes as itself and delivers that task's result,
    /// which runs once; without sessions ([`TransportHarness::supports_resume`] false) it is
    /// deregistered at once and the task moves to another worker.
    ResumeKeepsTasks,
}

impl Check {
    /// Every check, in the order [`run_conformance`] runs them.
    pub const ALL: [Check; 11] = [
        Check::AdmissionRefusals,
        Check::RoundTrip,
        Check::CapacityUnderBurst,
        Check::RoundRobin,
        Check::CancelReachesHandler,
        Check::DrainFinishesInFlight,
        Check::FrozenWorkerExcluded,
        Check::SeveredWorkerRedispatched,
        Check::DeregisteredWorkerDisconnected,
        Check::ExactlyOneOutcome,
        Check::ResumeKeepsTasks,
    ];

    /// A stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::AdmissionRefusals => "admission_refusals",
            Self::RoundTrip => "round_trip",
            Self::CapacityUnderBurst => "capacity_under_burst",
            Self::RoundRobin => "round_robin",
            Self::CancelReachesHandler => "cancel_reaches_handler",
            Self::DrainFinishesInFlight => "drain_finishes_in_flight",
            Self::FrozenWorkerExcluded => "frozen_worker_excluded",
            Self::SeveredWorkerRedispatched => "severed_worker_redispatched",
            Self::DeregisteredWorkerDisconnected => "deregistered_worker_disconnected",
            Self::ExactlyOneOutcome => "exactly_one_outcome",
            Self::ResumeKeepsTasks => "resume_keeps_tasks",
        }
    }

    /// Runs this check against `harness` with a fresh core and gateway.
    pub async fn run<H: TransportHarness>(self, harness: &H) -> Result<(), CheckFailure> {
        let verdict = match Fixture::start(harness).await {
            Ok(fixture) => match self {
                Self::AdmissionRefusals => admission::refusals(fixture).await,
                Self::RoundTrip => exchange::round_trip(fixture).await,
                Self::CapacityUnderBurst => exchange::capacity_under_burst(fixture).await,
                Self::RoundRobin => exchange::round_robin(fixture).await,
                Self::CancelReachesHandler => cancel::reaches_handler(fixture).await,
                Self::DrainFinishesInFlight => drain::finishes_in_flight(fixture).await,
                Self::FrozenWorkerExcluded => loss::frozen_worker_excluded(fixture).await,
                Self::SeveredWorkerRedispatched => loss::severed_worker_redispatched(fixture).await,
                Self::DeregisteredWorkerDisconnected => {
                    loss::deregistered_worker_disconnected(fixture).await
                }
                Self::ExactlyOneOutcome => exchange::exactly_one_outcome(fixture).await,
                Self::ResumeKeepsTasks => resume::resume_keeps_tasks(fixture).await,
            },
            Err(detail) => Err(detail),
        };
        verdict.map_err(|detail| CheckFailure {
            check: self,
            detail,
        })
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A check the transport failed, with the sentence saying what went wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("conformance check {check} failed: {detail}")]
pub struct CheckFailure {
    /// The check.
    pub check: Check,
    /// What the transport did wrong.
    pub detail: String,
}

/// Every check a transport failed in one [`run_conformance`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} of {} conformance checks failed:\n{}", .0.len(), Check::ALL.len(),
    .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConformanceFailures(pub Vec<CheckFailure>);

/// Runs every check in [`Check::ALL`] against `harness`, one after another, and reports all
/// the failures (not only the first).
pub async fn run_conformance<H: TransportHarness>(harness: &H) -> Result<(), ConformanceFailures> {
    let mut failures = Vec::new();
    for check in Check::ALL {
        let started = tokio::time::Instant::now();
        let result = check.run(harness).await;
        tracing::info!(
            check = check.name(),
            passed = result.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "conformance check"
        );
        if let Err(failure) = result {
            failures.push(failure);
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(ConformanceFailures(failures))
    }
}
