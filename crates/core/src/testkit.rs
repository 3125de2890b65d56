//! The transport conformance kit: one suite of checks every transport runs against itself.
//!
//! A transport crate implements [`TransportHarness`] (start its gateway side over a
//! [`Core`](crate::Core),
//! connect a worker with a [`WorkerSpec`], say whether it [`supports_resume`]) and
//! [`ConformanceWorker`] (the worker's id, [`sever`], [`freeze`] and [`break_link`]), then calls
//! [`run_conformance`]. Each [`Check`] builds a fresh core with the
//! short liveness of [`conformance_config`], starts the gateway, connects workers whose
//! handlers the kit observes on the worker side (calls, peak concurrency, cancels received),
//! and asserts one part of the contract every transport shares:
//!
//! | check | the transport must |
//! |---|---|
//! | [`Check::AdmissionRefusals`] | carry refusals to the worker naming the field or namespace |
//! | [`Check::RoundTrip`] | carry input, output and failures unchanged |
//! | [`Check::CapacityUnderBurst`] | never run more handlers than the capacity, and fill it |
//! | [`Check::RoundRobin`] | alternate sequential dispatches over two workers |
//! | [`Check::CancelReachesHandler`] | carry cancels and deadline expiry to the handler |
//! | [`Check::DrainFinishesInFlight`] | finish work on drain, take none, then close |
//! | [`Check::FrozenWorkerExcluded`] | answer pings in the runtime, so silence is noticed |
//! | [`Check::SeveredWorkerRedispatched`] | notice a dead connection, so its task moves |
//! | [`Check::ExactlyOneOutcome`] | route every result to its own caller, once |
//! | [`Check::ResumeKeepsTasks`] | resume a broken link's session, or else let the worker go |
//!
//! Checks run in real time (transports use real sockets), wait on events rather than sleeping,
//! and bound every wait; a failure is a sentence naming what the transport did wrong. A full run
//! takes a few seconds, most of it the frozen worker's silence window.
//!
//! [`memory`] is the in-memory transport core's own tests run the kit against; it is also the
//! smallest complete transport, worth reading before writing one.
//!
//! [`sever`]: ConformanceWorker::sever
//! [`freeze`]: ConformanceWorker::freeze
//! [`break_link`]: ConformanceWorker::break_link
//! [`supports_resume`]: TransportHarness::supports_resume
//!
//! # Examples
//!
//! A transport's whole conformance test (here the in-memory transport's):
//!
//! ```
//! use switchyard_core::testkit::{self, memory::MemoryHarness};
//!
//! # tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
//! #     .unwrap().block_on(async {
//! // In a transport crate: #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//! testkit::run_conformance(&MemoryHarness::new()).await?;
//! # Ok::<(), testkit::ConformanceFailures>(())
//! # }).unwrap();
//! ```
//!
//! Implementing the harness for a socket transport (sketch):
//!
//! ```ignore
//! struct GrpcHarness { tls: TestPki }
//!
//! #[async_trait::async_trait]
//! impl TransportHarness for GrpcHarness {
//!     type Gateway = RunningServer;      // drop stops the listener
//!     type Worker = TestWorker;          // implements ConformanceWorker
//!
//!     async fn start(&self, core: Core) -> Result<RunningServer, BoxError> {
//!         RunningServer::bind("127.0.0.1:0", core, &self.tls).await
//!     }
//!
//!     async fn connect(&self, gw: &RunningServer, spec: WorkerSpec)
//!         -> Result<TestWorker, HarnessError> {
//!         let token = gw.issue_token(spec.caller);   // credentials for exactly this caller
//!         TestWorker::connect(gw.addr(), token, spec.registration, spec.handler).await
//!             .map_err(|status| HarnessError::Refused {
//!                 kind: refusal_kind(status.code()),
//!                 message: status.message().to_owned(),
//!             })
//!     }
//! }
//! ```

mod check;
mod fixture;
mod handler;
mod harness;
pub mod memory;
mod probe;

use std::time::Duration;

pub use check::{Check, CheckFailure, ConformanceFailures, run_conformance};
pub use handler::{Handler, HandlerFuture, TaskCall};
pub use harness::{BoxError, ConformanceWorker, HarnessError, TransportHarness, WorkerSpec};

use crate::dispatcher::DispatchConfig;
use crate::handle::CoreConfig;
use crate::liveness::LivenessConfig;
use crate::registration::CallerIdentity;

/// Every caller the kit connects workers as, so a harness whose gateway authenticates from a
/// fixed table (tokens, certificates) can provision credentials for all of them in
/// [`TransportHarness::start`].
pub fn callers() -> [CallerIdentity; 2] {
    [fixture::worker_caller(), check::refused_caller()]
}

/// The core settings every check runs with: the default dispatcher and a liveness fast enough
/// for tests on real sockets (ping every 100 ms, missed after 300 ms, three misses to exclude,
/// silent for 1.5 s to deregister).
pub fn conformance_config() -> CoreConfig {
    CoreConfig {
        dispatch: DispatchConfig::default(),
        liveness: LivenessConfig {
            ping_interval: Duration::from_millis(100),
            ping_timeout: Duration::from_millis(300),
            probation_pings: 2,
            miss_threshold: 3,
            heartbeat_window: Duration::from_millis(1500),
        },
    }
}
