//! Names that locate work: pools, activity keys, worker ids and locality labels.

use std::fmt;

/// The task queue a registration or dispatch lands in when it names none.
pub const DEFAULT_TASK_QUEUE: &str = "default";

/// A `(namespace, task queue)` pair: the unit workers register into and producers dispatch to.
///
/// An empty task queue normalises to [`DEFAULT_TASK_QUEUE`]; the namespace is kept exactly as
/// given, so `""` and `"default"` are different namespaces and isolation never depends on
/// normalisation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolAddress {
    namespace: String,
    task_queue: String,
}

impl PoolAddress {
    /// Builds an address, normalising an empty task queue to [`DEFAULT_TASK_QUEUE`].
    pub fn new(namespace: impl Into<String>, task_queue: impl Into<String>) -> Self {
        let task_queue = task_queue.into();
        Self {
            namespace: namespace.into(),
            task_queue: normalise_task_queue(&task_queue).to_owned(),
        }
    }

    /// The namespace, as given.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The task queue, never empty.
    pub fn task_queue(&self) -> &str {
        &self.task_queue
    }
}

impl fmt::Display for PoolAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.task_queue)
    }
}

/// Maps an empty task queue to [`DEFAULT_TASK_QUEUE`]; every other name is returned unchanged.
pub fn normalise_task_queue(task_queue: &str) -> &str {
    if task_queue.is_empty() {
        DEFAULT_TASK_QUEUE
    } else {
        task_queue
    }
}

/// A pool plus an activity type: the key selection rotates over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActivityKey {
    /// The pool the activity is dispatched in.
    pub pool: PoolAddress,
    /// The activity type workers of the pool must serve.
    pub activity_type: String,
}

impl ActivityKey {
    /// Builds a key from its parts (the task queue is normalised).
    pub fn new(
        namespace: impl Into<String>,
        task_queue: impl Into<String>,
        activity_type: impl Into<String>,
    ) -> Self {
        Self {
            pool: PoolAddress::new(namespace, task_queue),
            activity_type: activity_type.into(),
        }
    }
}

impl fmt::Display for ActivityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pool, self.activity_type)
    }
}

/// A connected worker's id, unique for the life of the process (never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(u64);

impl WorkerId {
    /// Wraps a raw id (for wire decoding and tests; the registry mints real ones).
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw number, as carried on the wire.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A locality label a worker advertises (a host, rack or site); never empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node(String);

impl Node {
    /// Builds a label; an empty string means "no node" and yields `None`.
    pub fn new(label: impl Into<String>) -> Option<Self> {
        let label = label.into();
        (!label.is_empty()).then_some(Self(label))
    }

    /// The label text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

// `Node` hashes and orders exactly like its text, so maps keyed by it can be queried by `&str`.
impl std::borrow::Borrow<str> for Node {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_in_messages_as_the_bare_integers_the_wire_carries() {
        let worker = WorkerId::from_raw(22);
        let task = crate::delivery::TaskId::from_raw(7);
        assert_eq!(format!("worker {worker}, task {task}"), "worker 22, task 7");
        assert_eq!(worker.to_string(), worker.get().to_string());
    }

    #[test]
    fn empty_task_queue_normalises_but_namespace_does_not() {
        let pool = PoolAddress::new("", "");
        assert_eq!(pool.task_queue(), DEFAULT_TASK_QUEUE);
        assert_eq!(pool.namespace(), "");
        assert_eq!(PoolAddress::new("ns", "q").task_queue(), "q");
    }

    #[test]
    fn empty_node_is_none() {
        assert_eq!(Node::new(""), None);
        assert_eq!(
            Node::new("n1").map(|n| n.as_str().to_owned()),
            Some("n1".to_owned())
        );
    }
}
