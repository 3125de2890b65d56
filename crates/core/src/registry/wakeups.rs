//! Parked selections, queued per pool address in arrival order, and who a change wakes.
//!
//! A dispatch that finds no worker parks on its own `(namespace, task queue, activity type)`
//! queue. A freed slot wakes the first waiter of each pool its worker serves (skipping waiters
//! pinned to another node); an arrival, an announced capacity or a changed verdict wakes every
//! waiter of the worker's pools. Waiters of other pools are never touched, so parked work in
//! one tenant's pool costs another tenant nothing.
//!
//! A waiter keeps its arrival number for the life of its dispatch: a woken waiter that loses
//! the race for the slot re-queues under that number, at the front, not the back. A waiter
//! that leaves (selected, cancelled, timed out) after being woken and before selecting again
//! passes the wake on to the next waiter, so a wake is never lost with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::address::Node;
use crate::worker::Worker;

/// The pool address a selection parks on (task queue normalised).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    pub(crate) namespace: String,
    pub(crate) task_queue: String,
    pub(crate) activity_type: String,
}

/// One parked selection's side shared with the wakers.
#[derive(Debug, Default)]
struct Signal {
    notify: Notify,
    /// Set when a waker took the waiter off its queue; cleared when it re-queues.
    woken: AtomicBool,
}

#[derive(Debug)]
struct Waiter {
    node: Option<String>,
    signal: Arc<Signal>,
}

/// How many waiters of each pool a change wakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The first waiter that the worker could serve (a freed slot).
    One,
    /// Every waiter (an arrival, a capacity, a changed standing).
    All,
}

/// Every pool's queue of parked selections.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    next_seq: u64,
    /// Waiters queued over every pool.
    len: usize,
    queues: HashMap<PoolKey, BTreeMap<u64, Waiter>>,
    /// Wake-ups handed out since start (tests count them).
    woken: u64,
}

impl Wakeups {
    fn enqueue(&mut self, key: &PoolKey, seq: u64, node: Option<String>, signal: Arc<Signal>) {
        let waiter = Waiter { node, signal };
        // The key is copied only for a pool's first waiter, not on every arming.
        let replaced = match self.queues.get_mut(key) {
            Some(queue) => queue.insert(seq, waiter),
            None => self
                .queues
                .entry(key.clone())
                .or_default()
                .insert(seq, waiter),
        };
        if replaced.is_none() {
            self.len += 1;
        }
    }

    fn dequeue(&mut self, key: &PoolKey, seq: u64) {
        if let Some(queue) = self.queues.get_mut(key) {
            if queue.remove(&seq).is_some() {
                self.len = self.len.saturating_sub(1);
            }
            if queue.is_empty() {
                self.queues.remove(key);
                shrink_after_drain(&mut self.queues);
            }
        }
    }

    /// Wakes waiters of `key` that a worker on `node` could serve: the first one, or all.
    fn wake(&mut self, key: &PoolKey, node: Option<&Node>, how: Wake) {
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let servable = |waiter: &Waiter| {
            waiter
                .node
                .as_deref()
                .is_none_or(|pin| node.is_some_and(|n| n.as_str() == pin))
        };
        let chosen: Vec<u64> = match how {
            Wake::One => queue
                .iter()
                .find(|(_, waiter)| servable(waiter))
                .map(|(seq, _)| *seq)
                .into_iter()
                .collect(),
            Wake::All => queue
                .iter()
                .filter(|(_, waiter)| servable(waiter))
                .map(|(seq, _)| *seq)
                .collect(),
        };
        for seq in chosen {
            if let Some(waiter) = queue.remove(&seq) {
                self.len = self.len.saturating_sub(1);
                waiter.signal.woken.store(true, Ordering::Release);
                waiter.signal.notify.notify_one();
                self.woken += 1;
            }
        }
        if queue.is_empty() {
            self.queues.remove(key);
            shrink_after_drain(&mut self.queues);
        }
    }

    /// Wakes, in every pool `worker` serves, the waiters it could serve.
    pub(crate) fn wake_pools(&mut self, worker: &Worker, how: Wake) {
        if self.queues.is_empty() {
            return;
        }
        for namespace in worker.namespaces() {
            for activity_type in worker.activity_types() {
                let key = PoolKey {
                    namespace: namespace.clone(),
                    task_queue: worker.task_queue().to_owned(),
                    activity_type: activity_type.clone(),
                };
                self.wake(&key, worker.node(), how);
            }
        }
    }

    /// Waiters currently queued, over every pool.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.len
    }

    /// Wake-ups handed out since start.
    #[cfg(test)]
    pub(crate) fn woken(&self) -> u64 {
        self.woken
    }
}

/// Gives back the memory of a map that a large drain left mostly empty.
pub(crate) fn shrink_after_drain<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
) {
    if map.capacity() > 64 && map.capacity() > map.len() * 4 {
        map.shrink_to_fit();
    }
}

/// The shared queue table; cheap to clone.
#[derive(Clone, Debug, Default)]
pub(crate) struct WakeupTable(Arc<Table>);

#[derive(Debug, Default)]
pub(crate) struct Table {
    wakeups: Mutex<Wakeups>,
    /// How many waiters are queued, over every pool, readable without the lock.
    queued: AtomicUsize,
}

impl WakeupTable {
    pub(crate) fn lock(&self) -> TableGuard<'_> {
        TableGuard {
            guard: self
                .0
                .wakeups
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            queued: &self.0.queued,
        }
    }

    /// Whether any selection is queued anywhere (so a release has someone to wake).
    pub(crate) fn any_queued(&self) -> bool {
        self.0.queued.load(Ordering::SeqCst) > 0
    }
}

/// The locked table; keeps [`Table::queued`] in step with the queues when it is let go.
pub(crate) struct TableGuard<'a> {
    guard: MutexGuard<'a, Wakeups>,
    queued: &'a AtomicUsize,
}

impl std::ops::Deref for TableGuard<'_> {
    type Target = Wakeups;
    fn deref(&self) -> &Wakeups {
        &self.guard
    }
}

impl std::ops::DerefMut for TableGuard<'_> {
    fn deref_mut(&mut self) -> &mut Wakeups {
        &mut self.guard
    }
}

impl Drop for TableGuard<'_> {
    fn drop(&mut self) {
        self.queued.store(self.guard.len, Ordering::SeqCst);
    }
}

/// One parked selection's place in its pool's queue; see the module docs.
///
/// Call [`PoolWaiter::arm`] before each selection attempt and await [`PoolWaiter::woken`]
/// after a miss: a wake fired between the two is kept (as a stored permit), not lost.
#[must_use = "a waiter only helps if it is awaited after the selection"]
pub struct PoolWaiter {
    table: WakeupTable,
    key: PoolKey,
    seq: u64,
    node: Option<String>,
    signal: Arc<Signal>,
    queued: bool,
}

impl PoolWaiter {
    pub(crate) fn new(table: WakeupTable, key: PoolKey, node: Option<String>) -> Self {
        let seq = {
            let mut wakeups = table.lock();
            let seq = wakeups.next_seq;
            wakeups.next_seq += 1;
            seq
        };
        Self {
            table,
            key,
            seq,
            node,
            signal: Arc::new(Signal::default()),
            queued: false,
        }
    }

    /// (Re-)queues this waiter under its arrival number, ahead of every later arrival. Call
    /// before each selection attempt.
    pub fn arm(&mut self) {
        let mut wakeups = self.table.lock();
        // A waiter woken since it was last armed was taken off its queue by the waker.
        let popped = self.signal.woken.swap(false, Ordering::AcqRel);
        if popped || !self.queued {
            wakeups.enqueue(
                &self.key,
                self.seq,
                self.node.clone(),
                Arc::clone(&self.signal),
            );
            self.queued = true;
        }
    }

    /// Resolves once this waiter was woken since it was last armed.
    pub async fn woken(&mut self) {
        self.signal.notify.notified().await;
        self.queued = false;
    }
}

impl Drop for PoolWaiter {
    fn drop(&mut self) {
        let mut wakeups = self.table.lock();
        if self.signal.woken.load(Ordering::Acquire) {
            // Woken and leaving without selecting again: the wake may have been for a slot
            // nobody has taken; hand it to the next waiter.
            let node = self.node.clone().and_then(Node::new);
            wakeups.wake(&self.key, node.as_ref(), Wake::One);
        } else {
            wakeups.dequeue(&self.key, self.seq);
        }
    }
}

impl std::fmt::Debug for PoolWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolWaiter")
            .field("key", &self.key)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}
