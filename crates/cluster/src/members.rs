//! The membership view: which nodes refreshed their entry recently. Plain data, driven by the
//! membership watch with the time of each update.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// What a node publishes about itself in the membership bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its node name (the key).
    pub node: String,
    /// A random number drawn at start: tells this process from another one with its name.
    pub instance: u64,
    /// Its gRPC address, if known.
    pub grpc_addr: Option<String>,
    /// Its operations address, if known.
    pub ops_addr: Option<String>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
}

impl std::fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "instance {:016x}, started at {} ms",
            self.instance, self.started_unix_ms
        )?;
        if let Some(grpc) = &self.grpc_addr {
            write!(f, ", grpc {grpc}")?;
        }
        if let Some(ops) = &self.ops_addr {
            write!(f, ", ops {ops}")?;
        }
        Ok(())
    }
}

/// Nodes by the time their entry was last seen written.
#[derive(Debug, Default)]
pub(crate) struct Members {
    seen: HashMap<String, Instant>,
}

impl Members {
    /// `node` wrote its entry at `now`.
    pub(crate) fn seen(&mut self, node: &str, now: Instant) {
        self.seen.insert(node.to_owned(), now);
    }

    /// `node`'s entry was deleted (a clean shutdown).
    pub(crate) fn left(&mut self, node: &str) {
        self.seen.remove(node);
    }

    /// The nodes whose entry has not aged out at `now`, by name.
    pub(crate) fn live(&self, ttl: Duration, now: Instant) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .seen
            .keys()
            .filter(|node| self.is_live(node, ttl, now))
            .cloned()
            .collect();
        nodes.sort();
        nodes
    }

    /// True while `node`'s last write is younger than `ttl` (its entry has not aged out).
    pub(crate) fn is_live(&self, node: &str, ttl: Duration, now: Instant) -> bool {
        self.seen
            .get(node)
            .is_some_and(|at| now.saturating_duration_since(*at) < ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_live_until_its_entry_ages_out_or_is_deleted() {
        let ttl = Duration::from_secs(10);
        let start = Instant::now();
        let mut members = Members::default();
        assert!(!members.is_live("a", ttl, start), "never seen");
        members.seen("a", start);
        assert!(members.is_live("a", ttl, start + Duration::from_secs(9)));
        assert!(!members.is_live("a", ttl, start + ttl), "aged out");
        members.seen("a", start + Duration::from_secs(8));
        assert!(members.is_live("a", ttl, start + ttl), "a refresh keeps it");
        members.left("a");
        assert!(!members.is_live("a", ttl, start + ttl));
    }

    #[test]
    fn live_lists_only_the_nodes_whose_entry_has_not_aged_out() {
        let ttl = Duration::from_secs(10);
        let start = Instant::now();
        let mut members = Members::default();
        members.seen("c", start);
        members.seen("a", start + Duration::from_secs(5));
        assert_eq!(
            members.live(ttl, start + Duration::from_secs(9)),
            ["a", "c"]
        );
        // Control: once c's entry ages out it is no longer asked.
        assert_eq!(members.live(ttl, start + ttl), ["a"]);
    }
}
