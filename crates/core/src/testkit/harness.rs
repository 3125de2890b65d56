//! What a transport implements to run the conformance kit against itself.

use async_trait::async_trait;

use super::handler::Handler;
use crate::address::WorkerId;
use crate::admission::RefusalKind;
use crate::handle::Core;
use crate::registration::{CallerIdentity, Registration};

/// A boxed error for harness failures that are not part of the contract under test.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A worker the kit asks a harness to connect.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Who connects: the harness presents credentials its gateway maps to exactly this identity
    /// (a token table, a client certificate, or the identity itself for in-process links). It
    /// is always one of [`callers`](super::callers).
    pub caller: CallerIdentity,
    /// What the worker registers, passed to the transport as is (including invalid values the
    /// gateway must refuse). A non-zero `reconnect_grace` asks for a session: the worker
    /// registers as resumable (see [`TransportHarness::supports_resume`]).
    pub registration: Registration,
    /// Runs every task the worker receives, whatever its activity type.
    pub handler: Handler,
}

/// Why [`TransportHarness::connect`] produced no worker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The gateway (or the worker runtime's own validation) refused the registration.
    #[error("registration refused ({kind:?}): {message}")]
    Refused {
        /// The refusal's family, recovered from the wire status.
        kind: RefusalKind,
        /// The refusal text as the worker received it; it must name the field or rule broken.
        message: String,
    },
    /// Something else went wrong (socket, TLS, harness bug).
    #[error("transport failure: {0}")]
    Transport(#[source] BoxError),
}

/// The worker side of one connection, as seen by the kit.
///
/// Dropping it closes the worker's connection (gracefully or not).
pub trait ConformanceWorker: Send + Sync + 'static {
    /// The id the gateway gave the worker at registration.
    fn worker_id(&self) -> WorkerId;

    /// Ends the worker: its connection closes abruptly, with no goodbye frame, and its process
    /// is gone, as after a crash. The gateway must notice through the transport and deregister
    /// the worker (a worker with a session: suspend it until its grace ends).
    fn sever(&self);

    /// Freezes the worker: it stops reading from the connection and stops answering pings, but
    /// keeps the connection open. Running handlers may finish; their results need not be sent.
    fn freeze(&self);

    /// Breaks the link abruptly (as a pulled cable or a NAT rebinding would) while the worker
    /// process lives on: its running handlers keep running and its runtime reconnects by
    /// itself, resuming its session when the transport offers one.
    ///
    /// The default is [`ConformanceWorker::sever`]: a runtime that cannot reconnect is as good
    /// as dead once its link breaks, which is what a transport without sessions shows.
    fn break_link(&self) {
        self.sever();
    }
}

/// A transport under test: starts its gateway side over a [`Core`] and connects workers to it.
///
/// The worker runtime behind [`TransportHarness::connect`] must behave like the transport's
/// real SDK: answer pings by itself, run at most `max_concurrency` handlers at once, fire a
/// task's [`TaskCall::cancelled`](super::TaskCall::cancelled) when a cancel arrives (and send a
/// cancel acknowledgement or the result once the handler returns), on a drain request
/// finish the tasks it holds, take no more, then close, and (for a transport that
/// [`supports_resume`](TransportHarness::supports_resume)) resume its session by itself after
/// a broken link.
#[async_trait]
pub trait TransportHarness: Send + Sync {
    /// The running gateway side (listeners, server tasks); dropping it stops them.
    type Gateway: Send + Sync + 'static;
    /// A connected worker.
    type Worker: ConformanceWorker;

    /// Starts the gateway side of the transport, admitting workers into `core`.
    async fn start(&self, core: Core) -> Result<Self::Gateway, BoxError>;

    /// Connects one worker and registers it with `spec`.
    ///
    /// Resolves once the gateway has admitted the worker and its capacity is settled (for a
    /// transport that announces capacity after registration, once the announcement was
    /// accepted), or with [`HarnessError::Refused`] if either was refused. A worker refused
    /// after admission (its capacity announcement) must leave the registry as its connection
    /// closes; the kit allows a moment for that.
    async fn connect(
        &self,
        gateway: &Self::Gateway,
        spec: WorkerSpec,
    ) -> Result<Self::Worker, HarnessError>;

    /// Whether the transport keeps a worker's session across a broken link (its workers
    /// resume after [`ConformanceWorker::break_link`]). The default is false: the kit then
    /// checks the fallback, that a broken link deregisters the worker at once and its task
    /// moves, exactly as without sessions.
    ///
    /// Either way, [`Check::ResumeKeepsTasks`](super::Check::ResumeKeepsTasks) asks for a
    /// session by setting `registration.reconnect_grace` in its [`WorkerSpec`]: a harness maps
    /// a non-zero grace to its wire's resumable flag and gives its gateway a grace at least
    /// that long; a zero grace (every other check) means a worker without a session.
    fn supports_resume(&self) -> bool {
        false
    }
}
