//! The book of parked dispatches: which addresses wait, why, and since when.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::registry::{PoolCensus, UnservedReason};

/// The address a dispatch parks on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnservedAddress {
    /// Namespace.
    pub namespace: String,
    /// Task queue (normalised).
    pub task_queue: String,
    /// Activity type.
    pub activity_type: String,
    /// Node pin, if any.
    pub node: Option<String>,
}

/// An address with parked dispatches, as listed by [`crate::Dispatcher::unserved_queues`].
#[derive(Clone, Debug)]
pub struct UnservedQueue {
    /// Where the dispatches wait.
    pub address: UnservedAddress,
    /// Why, as last classified.
    pub reason: UnservedReason,
    /// The census behind the reason.
    pub census: PoolCensus,
    /// How many dispatches wait there now.
    pub waiting: usize,
    /// How long the oldest waiting dispatch has waited.
    pub oldest_wait: Duration,
}

struct Episode {
    reason: UnservedReason,
    census: PoolCensus,
    waiting: usize,
    since: Vec<Instant>,
}

#[derive(Default)]
pub(crate) struct UnservedBook {
    episodes: Mutex<HashMap<UnservedAddress, Episode>>,
}

impl UnservedBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UnservedAddress, Episode>> {
        self.episodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one more dispatch parked at `address`. The first dispatch of an episode logs
    /// one WARN naming the reason and the age of the last compatible worker.
    pub(crate) fn park(
        self: &Arc<Self>,
        address: UnservedAddress,
        reason: UnservedReason,
        census: PoolCensus,
    ) -> ParkTicket {
        let now = Instant::now();
        let mut book = self.lock();
        let episode = book.entry(address.clone()).or_insert_with(|| {
            let age = census.last_compatible_departure.map(|age| age.as_secs());
            if reason.is_transient() {
                tracing::debug!(namespace = %address.namespace, task_queue = %address.task_queue,
                    activity_type = %address.activity_type, reason = reason.as_str(),
                    "dispatches parked");
            } else {
                tracing::warn!(namespace = %address.namespace, task_queue = %address.task_queue,
                    activity_type = %address.activity_type, node = address.node.as_deref(),
                    reason = reason.as_str(), last_compatible_worker_left_secs_ago = age,
                    detail = census.describe().unwrap_or_default(), "dispatches parked: queue unserved");
            }
            Episode { reason, census: census.clone(), waiting: 0, since: Vec::new() }
        });
        episode.waiting += 1;
        episode.since.push(now);
        episode.reason = reason;
        episode.census = census;
        ParkTicket {
            book: Arc::clone(self),
            address,
            parked_at: now,
        }
    }

    pub(crate) fn reclassify(
        &self,
        address: &UnservedAddress,
        reason: UnservedReason,
        census: PoolCensus,
    ) {
        if let Some(episode) = self.lock().get_mut(address) {
            episode.reason = reason;
            episode.census = census;
        }
    }

    pub(crate) fn list(&self) -> Vec<UnservedQueue> {
        let now = Instant::now();
        let mut list: Vec<UnservedQueue> = self
            .lock()
            .iter()
            .map(|(address, e)| UnservedQueue {
                address: address.clone(),
                reason: e.reason,
                census: e.census.clone(),
                waiting: e.waiting,
                oldest_wait: e
                    .since
                    .iter()
                    .min()
                    .map_or(Duration::ZERO, |at| now.saturating_duration_since(*at)),
            })
            .collect();
        list.sort_by(|a, b| a.address.cmp(&b.address));
        list
    }

    fn unpark(&self, address: &UnservedAddress, parked_at: Instant) {
        let mut book = self.lock();
        let Some(episode) = book.get_mut(address) else {
            return;
        };
        episode.waiting = episode.waiting.saturating_sub(1);
        if let Some(i) = episode.since.iter().position(|at| *at == parked_at) {
            episode.since.swap_remove(i);
        }
        if episode.waiting == 0 {
            book.remove(address);
            tracing::debug!(namespace = %address.namespace, task_queue = %address.task_queue,
                activity_type = %address.activity_type, "queue served again");
        }
    }
}

/// One parked dispatch's place in the book; leaving (drop) ends its wait there.
pub(crate) struct ParkTicket {
    book: Arc<UnservedBook>,
    address: UnservedAddress,
    parked_at: Instant,
}

impl ParkTicket {
    pub(crate) fn address(&self) -> &UnservedAddress {
        &self.address
    }

    pub(crate) fn book(&self) -> &UnservedBook {
        &self.book
    }
}

impl Drop for ParkTicket {
    fn drop(&mut self) {
        self.book.unpark(&self.address, self.parked_at);
    }
}
