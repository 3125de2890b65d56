//! Controls for the conformance kit: a transport that breaks one part of the contract fails
//! the check for that part (and the kit says what went wrong).
#![cfg(feature = "testkit")]
// Test helpers outside `#[test]` functions assert too.
#![allow(clippy::expect_used, clippy::panic)]

use async_trait::async_trait;
use bytes::Bytes;
use switchyard_core::testkit::memory::{MemoryGateway, MemoryHarness, MemoryWorker};
use switchyard_core::testkit::{
    BoxError, Check, ConformanceWorker, Handler, HarnessError, TaskCall, TransportHarness,
    WorkerSpec,
};
use switchyard_core::{Core, TaskResult, WorkerId};

/// One way a transport can get the contract wrong.
#[derive(Clone, Copy)]
enum Fault {
    /// Refusals reach the worker without naming what was wrong.
    VagueRefusals,
    /// Outputs come back with a byte appended.
    CorruptsOutput,
    /// The worker advertises one more slot than it was asked to.
    OverstatesCapacity,
    /// Freezing does nothing: the runtime keeps answering.
    CannotFreeze,
    /// The gateway keeps a link open after core let its worker go.
    IgnoresDepartures,
    /// The harness claims resume support, but the gateway grants no session: a broken link
    /// deregisters the worker and it registers again under a new id.
    ReRegistersOnResume,
    /// The worker resumes but reports none of its tasks, so what it ran is dispatched again.
    ForgetsTasksOnResume,
    /// The harness declares resume unsupported, but the gateway suspends the worker.
    SuspendsUndeclared,
}

struct Faulty(Fault);

struct FaultyWorker {
    inner: MemoryWorker,
    fault: Fault,
}

impl ConformanceWorker for FaultyWorker {
    fn worker_id(&self) -> WorkerId {
        self.inner.id()
    }

    fn sever(&self) {
        self.inner.sever();
    }

    fn freeze(&self) {
        if !matches!(self.fault, Fault::CannotFreeze) {
            self.inner.freeze();
        }
    }

    fn break_link(&self) {
        self.inner.break_link();
    }
}

#[async_trait]
impl TransportHarness for Faulty {
    type Gateway = MemoryGateway;
    type Worker = FaultyWorker;

    async fn start(&self, core: Core) -> Result<MemoryGateway, BoxError> {
        let gateway = MemoryHarness::new().start(core).await?;
        Ok(match self.0 {
            Fault::IgnoresDepartures => gateway.ignoring_departures(),
            Fault::ReRegistersOnResume => gateway.without_sessions(),
            Fault::ForgetsTasksOnResume => gateway.forgetting_tasks_on_resume(),
            _ => gateway,
        })
    }

    fn supports_resume(&self) -> bool {
        !matches!(self.0, Fault::SuspendsUndeclared)
    }

    async fn connect(
        &self,
        gateway: &MemoryGateway,
        mut spec: WorkerSpec,
    ) -> Result<FaultyWorker, HarnessError> {
        match self.0 {
            Fault::CorruptsOutput => {
                let handler = spec.handler.clone();
                spec.handler = Handler::new(move |call: TaskCall| {
                    let run = handler.call(call);
                    async move {
                        match run.await {
                            TaskResult::Success(out) => {
                                TaskResult::Success(Bytes::from([&out[..], b"!"].concat()))
                            }
                            failure => failure,
                        }
                    }
                });
            }
            Fault::OverstatesCapacity => {
                spec.registration.max_concurrency =
                    spec.registration.max_concurrency.map(|n| n + 1);
            }
            Fault::VagueRefusals
            | Fault::CannotFreeze
            | Fault::IgnoresDepartures
            | Fault::ReRegistersOnResume
            | Fault::ForgetsTasksOnResume
            | Fault::SuspendsUndeclared => {}
        }
        let fault = self.0;
        match MemoryHarness::new().connect(gateway, spec).await {
            Ok(inner) => Ok(FaultyWorker { inner, fault }),
            Err(HarnessError::Refused { kind, .. }) if matches!(fault, Fault::VagueRefusals) => {
                Err(HarnessError::Refused {
                    kind,
                    message: "registration refused".to_owned(),
                })
            }
            Err(error) => Err(error),
        }
    }
}

async fn fails(fault: Fault, check: Check, naming: &str) {
    let failure = check
        .run(&Faulty(fault))
        .await
        .expect_err("a broken transport must fail the check");
    assert_eq!(failure.check, check);
    assert!(
        failure.detail.contains(naming),
        "the failure should say {naming:?}: {failure}"
    );
    // Control: the same check passes on the unbroken transport.
    check
        .run(&MemoryHarness::new())
        .await
        .expect("the in-memory transport passes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vague_refusals_fail_admission_refusals() {
    fails(
        Fault::VagueRefusals,
        Check::AdmissionRefusals,
        "does not name",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_output_fails_round_trip() {
    fails(Fault::CorruptsOutput, Check::RoundTrip, "an echo came back").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_delivery_fails_capacity_under_burst() {
    fails(
        Fault::OverstatesCapacity,
        Check::CapacityUnderBurst,
        "advertised capacity Some(4)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_keeps_answering_when_frozen_fails_frozen_worker_excluded() {
    fails(
        Fault::CannotFreeze,
        Check::FrozenWorkerExcluded,
        "not marked unreachable",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_ignores_departures_fails_deregistered_worker_disconnected() {
    fails(
        Fault::IgnoresDepartures,
        Check::DeregisteredWorkerDisconnected,
        "was still open",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_that_re_registers_instead_of_resuming_fails_resume_keeps_tasks() {
    fails(
        Fault::ReRegistersOnResume,
        Check::ResumeKeepsTasks,
        "instead of being suspended",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_forgets_its_tasks_on_resume_fails_resume_keeps_tasks() {
    fails(
        Fault::ForgetsTasksOnResume,
        Check::ResumeKeepsTasks,
        "dispatched again",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_that_suspends_without_declaring_resume_fails_resume_keeps_tasks() {
    fails(
        Fault::SuspendsUndeclared,
        Check::ResumeKeepsTasks,
        "declares resume unsupported",
    )
    .await;
}
