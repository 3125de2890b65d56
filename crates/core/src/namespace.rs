//! Namespace records, the policy for unknown namespaces, and placement rules.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::address::Node;

/// What the gate does with a namespace the store has never seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NamespacePolicy {
    /// Mint a record for it (exactly once, even under concurrent registrations).
    #[default]
    Open,
    /// Refuse the registration and create nothing.
    Closed,
}

/// Where the workers of a namespace must or should run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// No locality rule.
    #[default]
    Unplaced,
    /// A preference the gate does not enforce (advisory for schedulers and operators).
    Prefer(BTreeSet<Node>),
    /// Every worker serving the namespace must advertise one of these nodes.
    Pinned(BTreeSet<Node>),
}

/// A namespace as the store knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceRecord {
    /// The namespace name.
    pub name: String,
    /// Its placement rule.
    pub placement: Placement,
}

/// A failure of the namespace store itself (not a refusal).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("namespace store: {0}")]
pub struct StoreError(pub String);

/// Durable namespace records consulted by the admission gate.
#[async_trait]
pub trait NamespaceStore: Send + Sync + 'static {
    /// The record for `name`, if one exists.
    async fn get(&self, name: &str) -> Result<Option<NamespaceRecord>, StoreError>;

    /// Stores `record` unless one with that name exists; returns the record now stored. Must be
    /// atomic: concurrent callers for one name all see the same single record.
    async fn create_if_absent(
        &self,
        record: NamespaceRecord,
    ) -> Result<NamespaceRecord, StoreError>;

    /// The registry forgot `name`: it had no worker and no dispatch for
    /// `registry.namespace_idle_expiry`, or made room for a new namespace. A store may drop a
    /// record it minted on first registration; configured records must stay. The default
    /// keeps everything (a durable store is bounded by its own means).
    async fn forget(&self, name: &str) -> Result<(), StoreError> {
        let _ = name;
        Ok(())
    }
}

/// A [`NamespaceStore`] held in memory (the default, and the reference for other stores).
#[derive(Debug, Default)]
pub struct InMemoryNamespaceStore {
    records: Mutex<HashMap<String, NamespaceRecord>>,
    /// Records given at construction: never forgotten.
    configured: std::collections::HashSet<String>,
    creations: std::sync::atomic::AtomicU64,
}

impl InMemoryNamespaceStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store pre-loaded with `records` (configured namespaces).
    pub fn with_records(records: impl IntoIterator<Item = NamespaceRecord>) -> Self {
        let mut store = Self::default();
        let records: Vec<NamespaceRecord> = records.into_iter().collect();
        store.configured = records.iter().map(|r| r.name.clone()).collect();
        if let Ok(mut map) = store.records.lock() {
            map.extend(records.into_iter().map(|r| (r.name.clone(), r)));
        }
        store
    }

    /// How many records [`NamespaceStore::create_if_absent`] actually created.
    pub fn creations(&self) -> u64 {
        self.creations.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NamespaceRecord>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl NamespaceStore for InMemoryNamespaceStore {
    async fn get(&self, name: &str) -> Result<Option<NamespaceRecord>, StoreError> {
        Ok(self.lock().get(name).cloned())
    }

    async fn create_if_absent(
        &self,
        record: NamespaceRecord,
    ) -> Result<NamespaceRecord, StoreError> {
        let mut map = self.lock();
        let stored = map.entry(record.name.clone()).or_insert_with(|| {
            self.creations
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            record
        });
        Ok(stored.clone())
    }

    async fn forget(&self, name: &str) -> Result<(), StoreError> {
        if !self.configured.contains(name) {
            let mut map = self.lock();
            map.remove(name);
            if map.capacity() > 64 && map.capacity() > map.len() * 4 {
                map.shrink_to_fit();
            }
        }
        Ok(())
    }
}

impl InMemoryNamespaceStore {
    /// Records held now (configured and minted).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
