//! A registered worker as other components see it.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::address::{Node, WorkerId};
use crate::delivery::{TransportName, WorkerDelivery};
use crate::eligibility::Eligibility;

/// A cheap, cloneable handle on a registered worker's fixed facts and its delivery leg.
#[derive(Clone)]
pub struct Worker(Arc<WorkerInfo>);

struct WorkerInfo {
    id: WorkerId,
    namespaces: BTreeSet<String>,
    task_queue: String,
    node: Option<Node>,
    activity_types: BTreeSet<String>,
    identity: String,
    principal: String,
    transport: TransportName,
    delivery: Arc<dyn WorkerDelivery>,
    has_session: bool,
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: WorkerId,
        namespaces: BTreeSet<String>,
        task_queue: String,
        node: Option<Node>,
        activity_types: BTreeSet<String>,
        identity: String,
        principal: String,
        delivery: Arc<dyn WorkerDelivery>,
    ) -> Self {
        let transport = delivery.transport();
        Self(Arc::new(WorkerInfo {
            id,
            namespaces,
            task_queue,
            node,
            activity_types,
            identity,
            principal,
            transport,
            delivery,
            has_session: false,
        }))
    }

    /// The same worker, marked as registered with a session (see
    /// [`Worker::has_session`]); only before it is shared.
    pub(crate) fn with_session(self) -> Self {
        match Arc::try_unwrap(self.0) {
            Ok(mut info) => {
                info.has_session = true;
                Self(Arc::new(info))
            }
            Err(shared) => Self(shared),
        }
    }

    /// True when it registered with a session: a lost connection suspends it rather than
    /// removing it.
    pub fn has_session(&self) -> bool {
        self.0.has_session
    }

    /// Its id.
    pub fn id(&self) -> WorkerId {
        self.0.id
    }

    /// The namespaces it serves.
    pub fn namespaces(&self) -> &BTreeSet<String> {
        &self.0.namespaces
    }

    /// Its task queue (normalised, never empty).
    pub fn task_queue(&self) -> &str {
        &self.0.task_queue
    }

    /// Its locality label, if any.
    pub fn node(&self) -> Option<&Node> {
        self.0.node.as_ref()
    }

    /// The activity types it runs.
    pub fn activity_types(&self) -> &BTreeSet<String> {
        &self.0.activity_types
    }

    /// The identity it gave at registration.
    pub fn identity(&self) -> &str {
        &self.0.identity
    }

    /// The authenticated principal that registered it.
    pub fn principal(&self) -> &str {
        &self.0.principal
    }

    /// Its transport's name.
    pub fn transport(&self) -> &TransportName {
        &self.0.transport
    }

    /// Its delivery leg.
    pub fn delivery(&self) -> &Arc<dyn WorkerDelivery> {
        &self.0.delivery
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.0.id)
            .field("transport", &self.0.transport)
            .field("namespaces", &self.0.namespaces)
            .field("task_queue", &self.0.task_queue)
            .field("node", &self.0.node)
            .finish_non_exhaustive()
    }
}

/// A point-in-time view of a worker for listings.
#[derive(Clone, Debug)]
pub struct WorkerSnapshot {
    /// The worker.
    pub worker: Worker,
    /// Advertised capacity, `None` until announced.
    pub capacity: Option<u32>,
    /// Tasks it holds now (reserved or running).
    pub in_flight: u32,
    /// Its standing for selection.
    pub eligibility: Eligibility,
    /// When it registered.
    pub connected_at: SystemTime,
    /// Ended tasks it neither answered nor acknowledged in time, whose slots were reclaimed.
    pub unresponsive: u32,
    /// While its session is suspended: how long it has left to resume.
    pub suspended_for: Option<std::time::Duration>,
}
