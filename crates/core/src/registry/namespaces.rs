//! The namespaces with live state: how many workers each has per transport, how many
//! dispatches run in it, and since when it has been idle.
//!
//! A namespace stays listed (its `switchyard_workers_connected` series reads 0) for
//! `namespace_idle_expiry` after its last worker and dispatch left, then is forgotten, with its
//! minted store record. At most `max_namespaces` are listed: a registration into a new
//! namespace first makes room by forgetting the longest-idle ones, and is refused when every
//! listed namespace is live. Plain data driven by `now`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::wakeups::shrink_after_drain;
use crate::admission::AdmissionError;
use crate::delivery::TransportName;

/// Default [`crate::RegistryBuilder::max_namespaces`].
pub const DEFAULT_MAX_NAMESPACES_LIVE: usize = 10_000;
/// Default [`crate::RegistryBuilder::namespace_idle_expiry`]: 10 minutes.
pub const DEFAULT_NAMESPACE_IDLE_EXPIRY: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct Entry {
    connected: BTreeMap<TransportName, usize>,
    dispatches: usize,
    /// Set while nothing runs in the namespace.
    idle_since: Option<Instant>,
}

impl Entry {
    fn settle(&mut self, now: Instant) {
        let live = self.dispatches > 0 || self.connected.values().any(|n| *n > 0);
        self.idle_since = if live {
            None
        } else {
            Some(self.idle_since.unwrap_or(now))
        };
    }
}

/// One `switchyard_workers_connected` sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSeries {
    /// The namespace.
    pub namespace: String,
    /// The transport.
    pub transport: TransportName,
    /// Workers of that transport serving the namespace now.
    pub workers: usize,
}

/// The ledger; see the module docs.
#[derive(Debug)]
pub(crate) struct NamespaceLedger {
    entries: HashMap<String, Entry>,
    pub(crate) max: usize,
    pub(crate) expiry: Duration,
}

impl NamespaceLedger {
    pub(crate) fn new(max: usize, expiry: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            max,
            expiry,
        }
    }

    /// Forgets the namespaces idle for the expiry at `now`; returns their names.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        let expiry = self.expiry;
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, entry)| {
                entry
                    .idle_since
                    .is_some_and(|at| now.saturating_duration_since(at) >= expiry)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &expired {
            self.entries.remove(name);
        }
        if !expired.is_empty() {
            shrink_after_drain(&mut self.entries);
        }
        expired
    }

    /// Whether the new namespaces among `namespaces` fit under the cap once every idle
    /// namespace is forgotten; changes nothing.
    pub(crate) fn fits(&self, namespaces: &BTreeSet<String>) -> Result<(), AdmissionError> {
        let new = namespaces
            .iter()
            .filter(|ns| !self.entries.contains_key(*ns))
            .count();
        let live = self
            .entries
            .values()
            .filter(|entry| entry.idle_since.is_none())
            .count();
        if new > 0 && live + new > self.max {
            return Err(AdmissionError::NamespaceLimit { limit: self.max });
        }
        Ok(())
    }

    /// Makes room for the new namespaces among `namespaces` by forgetting the longest-idle
    /// ones; refuses naming `registry.max_namespaces` when every listed namespace is live.
    /// Returns the names forgotten.
    pub(crate) fn make_room(
        &mut self,
        namespaces: &BTreeSet<String>,
    ) -> Result<Vec<String>, AdmissionError> {
        let new = namespaces
            .iter()
            .filter(|ns| !self.entries.contains_key(*ns))
            .count();
        let over = (self.entries.len() + new).saturating_sub(self.max);
        if over == 0 {
            return Ok(Vec::new());
        }
        let mut idle: Vec<(Instant, &String)> = self
            .entries
            .iter()
            .filter_map(|(name, entry)| entry.idle_since.map(|at| (at, name)))
            .collect();
        if idle.len() < over {
            return Err(AdmissionError::NamespaceLimit { limit: self.max });
        }
        idle.sort_unstable();
        let forgotten: Vec<String> = idle
            .into_iter()
            .take(over)
            .map(|(_, n)| n.clone())
            .collect();
        for name in &forgotten {
            self.entries.remove(name);
        }
        Ok(forgotten)
    }

    /// A worker of `transport` joined `namespaces`.
    pub(crate) fn joined(&mut self, namespaces: &BTreeSet<String>, transport: &TransportName) {
        for namespace in namespaces {
            let entry = self.entries.entry(namespace.clone()).or_default();
            *entry.connected.entry(transport.clone()).or_default() += 1;
            entry.idle_since = None;
        }
    }

    /// A worker of `transport` left `namespaces` at `now`.
    pub(crate) fn left(
        &mut self,
        namespaces: &BTreeSet<String>,
        transport: &TransportName,
        now: Instant,
    ) {
        for namespace in namespaces {
            if let Some(entry) = self.entries.get_mut(namespace) {
                if let Some(count) = entry.connected.get_mut(transport) {
                    *count = count.saturating_sub(1);
                }
                entry.settle(now);
            }
        }
    }

    /// A dispatch started in `namespace`; false (nothing counted) for a namespace not listed,
    /// so dispatches never add namespaces.
    pub(crate) fn dispatch_started(&mut self, namespace: &str) -> bool {
        let Some(entry) = self.entries.get_mut(namespace) else {
            return false;
        };
        entry.dispatches += 1;
        entry.idle_since = None;
        true
    }

    /// A dispatch counted by [`NamespaceLedger::dispatch_started`] ended at `now`.
    pub(crate) fn dispatch_ended(&mut self, namespace: &str, now: Instant) {
        if let Some(entry) = self.entries.get_mut(namespace) {
            entry.dispatches = entry.dispatches.saturating_sub(1);
            entry.settle(now);
        }
    }

    /// The samples of every namespace not yet expired at `now`, by namespace then transport.
    pub(crate) fn series(&self, now: Instant) -> Vec<NamespaceSeries> {
        let mut series: Vec<NamespaceSeries> = self
            .entries
            .iter()
            .filter(|(_, entry)| {
                entry
                    .idle_since
                    .is_none_or(|at| now.saturating_duration_since(at) < self.expiry)
            })
            .flat_map(|(name, entry)| {
                entry
                    .connected
                    .iter()
                    .map(|(transport, workers)| NamespaceSeries {
                        namespace: name.clone(),
                        transport: transport.clone(),
                        workers: *workers,
                    })
            })
            .collect();
        series.sort_by(|a, b| {
            (a.namespace.as_str(), a.transport.as_str())
                .cmp(&(b.namespace.as_str(), b.transport.as_str()))
        });
        series
    }

    /// Namespaces listed.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn an_idle_namespace_is_listed_until_its_expiry_then_forgotten() {
        let t0 = Instant::now();
        let grpc = TransportName::from_static("grpc");
        let mut ledger = NamespaceLedger::new(10, Duration::from_secs(600));
        ledger.joined(&names(&["a"]), &grpc);
        ledger.left(&names(&["a"]), &grpc, t0);
        // Control: before the expiry the namespace still reads, at 0 workers.
        let before = ledger.series(t0 + Duration::from_secs(599));
        assert_eq!(before.len(), 1);
        assert_eq!(before[0].workers, 0);
        assert!(ledger.expire(t0 + Duration::from_secs(599)).is_empty());
        assert!(ledger.series(t0 + Duration::from_secs(600)).is_empty());
        assert_eq!(
            ledger.expire(t0 + Duration::from_secs(600)),
            vec!["a".to_owned()]
        );
        assert_eq!(ledger.len(), 0);
    }

    #[test]
    fn a_running_dispatch_keeps_a_namespace_without_workers() {
        let t0 = Instant::now();
        let grpc = TransportName::from_static("grpc");
        let mut ledger = NamespaceLedger::new(10, Duration::from_secs(60));
        assert!(
            !ledger.dispatch_started("unknown"),
            "dispatches add no namespace"
        );
        ledger.joined(&names(&["a"]), &grpc);
        assert!(ledger.dispatch_started("a"));
        ledger.left(&names(&["a"]), &grpc, t0);
        assert!(ledger.expire(t0 + Duration::from_secs(3600)).is_empty());
        ledger.dispatch_ended("a", t0 + Duration::from_secs(3600));
        // Control: idle from the dispatch's end, it expires one window later.
        assert!(ledger.expire(t0 + Duration::from_secs(3659)).is_empty());
        assert_eq!(ledger.expire(t0 + Duration::from_secs(3660)).len(), 1);
    }

    #[test]
    fn past_the_cap_idle_namespaces_make_room_and_live_ones_refuse() {
        let t0 = Instant::now();
        let grpc = TransportName::from_static("grpc");
        let mut ledger = NamespaceLedger::new(2, Duration::from_secs(600));
        ledger.joined(&names(&["a", "b"]), &grpc);
        let refused = ledger.make_room(&names(&["c"])).expect_err("both live");
        assert_eq!(refused, AdmissionError::NamespaceLimit { limit: 2 });
        assert!(
            refused
                .to_string()
                .contains("`registry.max_namespaces` (2)")
        );
        // Control: a namespace already listed needs no room.
        assert_eq!(ledger.make_room(&names(&["a"])), Ok(Vec::new()));
        ledger.left(&names(&["a", "b"]), &grpc, t0);
        assert_eq!(
            ledger.make_room(&names(&["c"])),
            Ok(vec!["a".to_owned()]),
            "the longest idle (ties by name) makes room"
        );
        // Not by name: `z`, idle a second longer than `y`, is the one forgotten.
        let mut ledger = NamespaceLedger::new(2, Duration::from_secs(600));
        ledger.joined(&names(&["y", "z"]), &grpc);
        ledger.left(&names(&["z"]), &grpc, t0);
        ledger.left(&names(&["y"]), &grpc, t0 + Duration::from_secs(1));
        assert_eq!(
            ledger.make_room(&names(&["c"])),
            Ok(vec!["z".to_owned()]),
            "the longest idle makes room"
        );
    }
}
