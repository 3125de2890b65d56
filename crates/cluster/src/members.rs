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

/// Nodes by the time their entry was last seen written, and the process instance that wrote it.
#[derive(Debug, Default)]
pub(crate) struct Members {
    seen: HashMap<String, (Instant, u64)>,
}

impl Members {
    /// `node`'s process `instance` wrote its entry at `now`.
    pub(crate) fn seen(&mut self, node: &str, instance: u64, now: Instant) {
        self.seen.insert(node.to_owned(), (now, instance));
    }

    /// The process instance that last wrote `node`'s entry.
    pub(crate) fn instance(&self, node: &str) -> Option<u64> {
        self.seen.get(node).map(|(_, instance)| *instance)
    }

    /// True when `node` is now held by another process than `instance` (the one that took a
    /// task): the process that took it is gone, even though the name is live again (a node
    /// restarted under its name within one check). `instance` `None` (the node was not seen
    /// yet when the task was taken) takes the current one.
    pub(crate) fn replaced(&self, node: &str, instance: &mut Option<u64>) -> bool {
        let Some((_, now)) = self.seen.get(node) else {
            return false;
        };
        match *instance {
            Some(then) => then != *now,
            None => {
                *instance = Some(*now);
                false
            }
        }
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
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) < ttl)
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
        members.seen("a", 1, start);
        assert!(members.is_live("a", ttl, start + Duration::from_secs(9)));
        assert!(!members.is_live("a", ttl, start + ttl), "aged out");
        members.seen("a", 1, start + Duration::from_secs(8));
        assert!(members.is_live("a", ttl, start + ttl), "a refresh keeps it");
        members.left("a");
        assert!(!members.is_live("a", ttl, start + ttl));
    }

    #[test]
    fn a_node_restarted_under_its_name_is_another_process() {
        let start = Instant::now();
        let mut members = Members::default();
        let mut took = None;
        assert!(
            !members.replaced("b", &mut took),
            "never seen: nothing to compare"
        );
        members.seen("b", 7, start);
        assert!(
            !members.replaced("b", &mut took),
            "first sight sets the instance"
        );
        assert_eq!(took, Some(7));
        members.seen("b", 7, start + Duration::from_secs(1));
        assert!(
            !members.replaced("b", &mut took),
            "a refresh by the same process"
        );
        // A restart under the same name: live again at once, yet the taker is gone.
        members.seen("b", 8, start + Duration::from_secs(4));
        assert!(members.is_live("b", Duration::from_secs(3), start + Duration::from_secs(4)));
        assert!(members.replaced("b", &mut took));
    }

    #[test]
    fn live_lists_only_the_nodes_whose_entry_has_not_aged_out() {
        let ttl = Duration::from_secs(10);
        let start = Instant::now();
        let mut members = Members::default();
        members.seen("c", 1, start);
        members.seen("a", 2, start + Duration::from_secs(5));
        assert_eq!(
            members.live(ttl, start + Duration::from_secs(9)),
            ["a", "c"]
        );
        // Control: once c's entry ages out it is no longer asked.
        assert_eq!(members.live(ttl, start + ttl), ["a"]);
    }
}
