//! Readiness: the gateway is ready once every configured transport listens, and stops being
//! ready when shutdown begins. In cluster mode it also carries the node's cluster standing,
//! which `/readyz` and `/healthz` show; a degraded cluster does not make the node unready (it
//! still serves its own workers).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Shared readiness state; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    /// Transport name → listening.
    transports: BTreeMap<String, bool>,
    shutting_down: bool,
    cluster: Option<switchyard_cluster::ClusterStatus>,
}

/// Why the gateway is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// These configured transports do not listen yet.
    Waiting(Vec<String>),
    /// Shutdown has begun.
    ShuttingDown,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Waiting(names) => write!(f, "not listening yet: {}", names.join(", ")),
            Self::ShuttingDown => f.write_str("shutting down"),
        }
    }
}

impl Readiness {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Declares a transport the gateway will start.
    pub(crate) fn expect(&self, transport: &str) {
        self.lock().transports.insert(transport.to_owned(), false);
    }

    /// Records that a transport listens.
    pub(crate) fn listening(&self, transport: &str) {
        self.lock().transports.insert(transport.to_owned(), true);
    }

    /// Records that shutdown began.
    pub(crate) fn shutting_down(&self) {
        self.lock().shutting_down = true;
    }

    /// Shows `status` on `/readyz` and `/healthz`.
    pub(crate) fn cluster(&self, status: switchyard_cluster::ClusterStatus) {
        self.lock().cluster = Some(status);
    }

    /// `cluster: joined as <node>` or `cluster: degraded (<reason>)`; `None` outside a
    /// cluster.
    pub fn cluster_line(&self) -> Option<String> {
        self.lock().cluster.as_ref().map(|status| status.describe())
    }

    /// The cluster node name; `None` outside a cluster.
    pub fn cluster_node(&self) -> Option<String> {
        self.lock().cluster.as_ref().map(|status| status.node())
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), NotReady> {
        let state = self.lock();
        if state.shutting_down {
            return Err(NotReady::ShuttingDown);
        }
        let waiting: Vec<String> = state
            .transports
            .iter()
            .filter(|(_, listening)| !**listening)
            .map(|(name, _)| name.clone())
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(NotReady::Waiting(waiting))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_expected_transport_listens_and_not_after_shutdown() {
        let readiness = Readiness::default();
        readiness.expect("grpc");
        readiness.expect("quic");
        readiness.listening("grpc");
        assert_eq!(
            readiness.check(),
            Err(NotReady::Waiting(vec!["quic".to_owned()]))
        );
        readiness.listening("quic");
        assert_eq!(readiness.check(), Ok(()));
        readiness.shutting_down();
        assert_eq!(readiness.check(), Err(NotReady::ShuttingDown));
    }
}
