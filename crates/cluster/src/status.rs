//! [`ClusterStatus`]: what `/readyz` and `/healthz` say about the node's cluster membership.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

/// Where the node stands in its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// Connected to NATS and holding its node name.
    Joined,
    /// Serving local workers only, for this reason; it rejoins by itself.
    Degraded(String),
}

/// The node's standing, shared between the cluster's tasks and the readiness endpoints;
/// cheap to clone.
#[derive(Clone, Debug)]
pub struct ClusterStatus {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    node: String,
    standing: Standing,
    /// Connected to NATS (since when); `None` while disconnected.
    connected_since: Option<Instant>,
}

impl ClusterStatus {
    pub(crate) fn new(node: &str) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                node: node.to_owned(),
                standing: Standing::Degraded("connecting to NATS".to_owned()),
                connected_since: None,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The node's name.
    pub fn node(&self) -> String {
        self.lock().node.clone()
    }

    /// The node's standing now.
    pub fn standing(&self) -> Standing {
        self.lock().standing.clone()
    }

    /// One line for `/readyz` and `/healthz`: `cluster: joined as <node>` or
    /// `cluster: degraded (<reason>)`.
    pub fn describe(&self) -> String {
        let state = self.lock();
        match &state.standing {
            Standing::Joined => format!("cluster: joined as {}", state.node),
            Standing::Degraded(reason) => format!("cluster: degraded ({reason})"),
        }
    }

    pub(crate) fn set(&self, standing: Standing) {
        let mut state = self.lock();
        if state.standing != standing {
            match &standing {
                Standing::Joined => tracing::info!(node = %state.node, "cluster: joined"),
                Standing::Degraded(reason) => {
                    tracing::warn!(node = %state.node, %reason, "cluster: degraded")
                }
            }
        }
        state.standing = standing;
    }

    pub(crate) fn connected(&self, now: Instant) {
        self.lock().connected_since.get_or_insert(now);
    }

    pub(crate) fn disconnected(&self, reason: &str) {
        let mut state = self.lock();
        state.connected_since = None;
        drop(state);
        self.set(Standing::Degraded(reason.to_owned()));
    }

    /// True once the node has been connected for at least `span` without a break: only then
    /// does its view of the membership tell a lost node from its own missed updates.
    pub(crate) fn connected_for(&self, span: std::time::Duration, now: Instant) -> bool {
        self.lock()
            .connected_since
            .is_some_and(|since| now.saturating_duration_since(since) >= span)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// `docs/cluster.md`: a node whose own connection was down does not trust its view of the
    /// membership (and so declares no node lost) until it has been connected for a whole TTL
    /// again; the sweep's half is `forward::tests::the_sweep_ends_only_the_forwards_of_a_gone_taker`.
    #[test]
    fn only_a_whole_span_connected_since_the_last_break_counts() {
        let ttl = Duration::from_secs(3);
        let start = Instant::now();
        let status = ClusterStatus::new("a");
        assert!(!status.connected_for(ttl, start), "never connected");
        status.connected(start);
        assert!(!status.connected_for(ttl, start + ttl - Duration::from_millis(1)));
        assert!(
            status.connected_for(ttl, start + ttl),
            "control: a whole TTL"
        );
        // A break: the span starts again at the reconnect, not at the first connect.
        status.disconnected("NATS connection lost");
        assert!(!status.connected_for(ttl, start + ttl * 2));
        let back = start + ttl * 2;
        status.connected(back);
        assert!(!status.connected_for(ttl, back + ttl - Duration::from_millis(1)));
        assert!(status.connected_for(ttl, back + ttl));
        // A second "connected" while connected does not move the start.
        status.connected(back + ttl);
        assert!(status.connected_for(ttl, back + ttl));
    }
}
