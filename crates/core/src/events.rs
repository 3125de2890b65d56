//! Worker lifecycle events, published on a bounded broadcast channel.

use std::collections::BTreeSet;

use crate::address::{Node, WorkerId};
use crate::delivery::TransportName;
use crate::eligibility::DispatchExclusion;

/// Why a worker left the registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// Its connection ended (closed, reset, or the registration token dropped).
    Disconnect,
    /// It was silent for the whole heartbeat window.
    Timeout,
    /// It finished a drain, or was drained on a transport without a drain channel.
    Drained,
    /// It left `dispatch.max_unresponsive_tasks` ended tasks neither answered nor
    /// acknowledged within `dispatch.cancel_ack_timeout`, and was drained and removed.
    Unresponsive,
    /// Its connection ended, its session was suspended, and no connection resumed it within
    /// the reconnect grace.
    ReconnectGraceExpired,
    /// It closed its connection on purpose without a drain (a goodbye, a stopped worker), or
    /// broke the protocol: unlike a lost connection, this never suspends a session; the
    /// worker leaves at once.
    Closed,
    /// Not a departure of the worker: this connection was replaced by a newer one that
    /// resumed the session. Only a transport's [`crate::Departure`] of the old connection
    /// sees it; no event or metric carries it.
    Superseded,
}

impl DisconnectReason {
    /// A short lowercase word for logs and the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disconnect => "disconnect",
            Self::Timeout => "timeout",
            Self::Drained => "drained",
            Self::Unresponsive => "unresponsive",
            Self::ReconnectGraceExpired => "reconnect_grace_expired",
            Self::Closed => "closed",
            Self::Superseded => "superseded",
        }
    }
}

/// Something that happened to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// A worker passed the admission gate.
    Connected {
        /// Its id.
        worker: WorkerId,
        /// Its transport.
        transport: TransportName,
        /// The namespaces it serves.
        namespaces: BTreeSet<String>,
        /// Its task queue.
        task_queue: String,
        /// Its node.
        node: Option<Node>,
    },
    /// A worker left; emitted exactly once per worker.
    Disconnected {
        /// Its id.
        worker: WorkerId,
        /// Why.
        reason: DisconnectReason,
    },
    /// The liveness prober excluded a worker from selection. Never emitted for a new worker's
    /// opening probation, which every worker goes through: an alert on exclusions must not
    /// fire once per registration.
    Excluded {
        /// Its id.
        worker: WorkerId,
        /// The exclusion.
        exclusion: DispatchExclusion,
    },
    /// A new worker passed its opening probation and is eligible for the first time.
    ProbationPassed {
        /// Its id.
        worker: WorkerId,
    },
    /// A worker excluded by an [`WorkerEvent::Excluded`] is eligible again.
    Recovered {
        /// Its id.
        worker: WorkerId,
    },
    /// A session worker's connection ended without a drain: it is suspended (not eligible,
    /// keeping its slots and tasks) until a connection resumes it or the grace ends.
    Suspended {
        /// Its id.
        worker: WorkerId,
        /// How long it may take to resume.
        grace: std::time::Duration,
    },
    /// A suspended (or still connected) session worker resumed on a new connection.
    Resumed {
        /// Its id.
        worker: WorkerId,
    },
    /// A worker announced (or re-announced) its capacity.
    CapacityAnnounced {
        /// Its id.
        worker: WorkerId,
        /// The new capacity.
        capacity: u32,
    },
}

/// The event (if any) announcing that `worker`'s liveness exclusion went from `before` to
/// `after`: entering or leaving the opening probation is not an exclusion or a recovery.
pub(crate) fn standing_change(
    worker: WorkerId,
    before: Option<DispatchExclusion>,
    after: Option<DispatchExclusion>,
) -> Option<WorkerEvent> {
    match (before, after) {
        (_, Some(DispatchExclusion::OpeningProbation)) => None,
        (Some(DispatchExclusion::OpeningProbation), None) => {
            Some(WorkerEvent::ProbationPassed { worker })
        }
        (_, Some(exclusion)) => Some(WorkerEvent::Excluded { worker, exclusion }),
        (Some(_), None) => Some(WorkerEvent::Recovered { worker }),
        (None, None) => None,
    }
}
