//! [`Core`]: one registry, one dispatcher and one liveness prober, shared by every transport.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::address::WorkerId;
use crate::delivery::{TaskId, WorkerDelivery, WorkerMessage};
use crate::dispatcher::{DispatchConfig, Dispatcher};
use crate::liveness::{Liveness, LivenessConfig};
use crate::outcome::{CompletionRefused, TaskResult};
use crate::registration::CallerIdentity;
use crate::registry::{Registry, RegistryBuilder};
use crate::session::{ResumeRefused, ResumeRequest, Resumed};

/// Settings for [`Core::start`].
#[derive(Clone, Debug, Default)]
pub struct CoreConfig {
    /// Dispatcher settings.
    pub dispatch: DispatchConfig,
    /// Liveness settings.
    pub liveness: LivenessConfig,
}

/// The process-wide state every transport plugs into; cheap to clone.
///
/// Transports admit workers through [`Core::registry`] and hand everything a worker sends back
/// through the entry points here: [`Core::complete`], [`Core::cancel_acknowledged`],
/// [`Core::record_pong`] and [`Core::record_frame`].
#[derive(Clone)]
pub struct Core {
    registry: Registry,
    dispatcher: Dispatcher,
    liveness: Liveness,
    prober: Arc<ProberTask>,
}

struct ProberTask(JoinHandle<()>);

impl Drop for ProberTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// Builds the registry from `registry` (with opening probation on, since a prober runs),
    /// the dispatcher and the prober, and starts the prober on the current tokio runtime.
    pub fn start(registry: RegistryBuilder, config: CoreConfig) -> Self {
        let registry = registry.opening_probation(true).build();
        let dispatcher = Dispatcher::new(registry.clone(), config.dispatch);
        let liveness = Liveness::new(registry.clone(), config.liveness);
        let prober = Arc::new(ProberTask(liveness.spawn()));
        Self {
            registry,
            dispatcher,
            liveness,
            prober,
        }
    }

    /// The registry (admission gate, selection, census).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The dispatcher (dispatch, cancel, unserved queues, shutdown).
    pub fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// The liveness prober.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Resumes the session `request` names on a new connection whose leg is `delivery`
    /// (see [`SessionGrant`](crate::SessionGrant) and `docs/architecture.md` for the rules). Like
    /// [`Registry::admit_unannounced`](crate::Registry::admit_unannounced), the worker is not
    /// dispatched to until the transport has its acknowledgement on the wire and calls
    /// [`RegistrationToken::announce`](crate::RegistrationToken::announce); the cancels of
    /// held tasks whose dispatch ended meanwhile follow the announcement. A refusal changes
    /// nothing and is counted (`switchyard_resume_refused_total{reason}`).
    pub async fn resume(
        &self,
        caller: &CallerIdentity,
        request: ResumeRequest,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Result<Resumed, ResumeRefused> {
        let inner = &self.registry.inner;
        let reattached = match inner.reattach(caller, &request, delivery) {
            Ok(reattached) => reattached,
            Err(refusal) => {
                inner.resume_refused(caller, &refusal);
                return Err(refusal);
            }
        };
        let worker = reattached.token.worker_id();
        let (held, cancels) =
            self.dispatcher
                .reconcile_resumed(worker, &request.running, &request.unacked);
        inner.queue_after_resume(
            worker,
            cancels
                .into_iter()
                .map(|(task_id, reason)| WorkerMessage::Cancel { task_id, reason })
                .collect(),
        );
        Ok(Resumed {
            token: reattached.token,
            held,
            grant: reattached.grant,
            task_queue: reattached.task_queue,
            capacity: reattached.capacity,
        })
    }

    /// A worker's result for `task`; see [`Dispatcher::complete`].
    pub fn complete(
        &self,
        worker: WorkerId,
        task: TaskId,
        result: TaskResult,
    ) -> Result<(), CompletionRefused> {
        self.liveness.record_frame(worker);
        self.dispatcher.complete(worker, task, result)
    }

    /// A worker stopped a cancelled task; see [`Dispatcher::cancel_acknowledged`].
    pub fn cancel_acknowledged(
        &self,
        worker: WorkerId,
        task: TaskId,
    ) -> Result<(), CompletionRefused> {
        self.liveness.record_frame(worker);
        self.dispatcher.cancel_acknowledged(worker, task)
    }

    /// A worker answered ping `seq`.
    pub fn record_pong(&self, worker: WorkerId, seq: u64) {
        self.liveness.record_pong(worker, seq);
    }

    /// Any other frame arrived from a worker (keeps it from being judged silent).
    pub fn record_frame(&self, worker: WorkerId) {
        self.liveness.record_frame(worker);
    }

    /// Graceful shutdown; see [`Dispatcher::shutdown`]. The prober stops afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        self.dispatcher.shutdown(grace).await;
        self.prober.0.abort();
    }
}
