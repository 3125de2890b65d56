//! The book of parked dispatches: which addresses wait, why, since when, and one WARN per
//! address per episode.
//!
//! An episode starts when the first dispatch parks at an address and ends when the last one
//! leaves. Its WARN goes out once, the first time the episode is classified with a reason that
//! does not clear by itself (a first look that saw only probation stays quiet, and warns later
//! if the wait turns out to be something else).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::registry::{PoolCensus, Registry, UnservedReason};

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
    /// Why, classified from the census at the time of listing.
    pub reason: UnservedReason,
    /// The census behind the reason, taken at the time of listing.
    pub census: PoolCensus,
    /// How many dispatches wait there now.
    pub waiting: usize,
    /// How long the oldest waiting dispatch has waited.
    pub oldest_wait: Duration,
}

struct Episode {
    reason: UnservedReason,
    /// Park instants of the waiting dispatches, with how many parked at each (a multiset, so
    /// leaving and finding the oldest are both logarithmic).
    parked: BTreeMap<Instant, usize>,
    waiting: usize,
    warned: bool,
}

#[derive(Default)]
pub(crate) struct UnservedBook {
    episodes: Mutex<HashMap<UnservedAddress, Episode>>,
    warnings: AtomicU64,
}

impl UnservedBook {
    fn lock(&self) -> MutexGuard<'_, HashMap<UnservedAddress, Episode>> {
        self.episodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one more dispatch parked at `address`, classified as `reason` from `census`.
    pub(crate) fn park(
        self: &Arc<Self>,
        address: UnservedAddress,
        reason: UnservedReason,
        census: &PoolCensus,
    ) -> ParkTicket {
        let now = Instant::now();
        let mut book = self.lock();
        let episode = book.entry(address.clone()).or_insert_with(|| Episode {
            reason,
            parked: BTreeMap::new(),
            waiting: 0,
            warned: false,
        });
        episode.waiting += 1;
        *episode.parked.entry(now).or_default() += 1;
        self.classified(&address, episode, reason, census);
        ParkTicket {
            book: Arc::clone(self),
            address,
            parked_at: now,
        }
    }

    /// A parked dispatch looked again and found `reason`.
    pub(crate) fn reclassify(
        &self,
        address: &UnservedAddress,
        reason: UnservedReason,
        census: &PoolCensus,
    ) {
        if let Some(episode) = self.lock().get_mut(address) {
            self.classified(address, episode, reason, census);
        }
    }

    fn classified(
        &self,
        address: &UnservedAddress,
        episode: &mut Episode,
        reason: UnservedReason,
        census: &PoolCensus,
    ) {
        episode.reason = reason;
        if episode.warned || reason.is_transient() {
            return;
        }
        episode.warned = true;
        self.warnings.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("switchyard_unserved_episodes_total", "reason" => reason.as_str())
            .increment(1);
        tracing::warn!(namespace = %address.namespace, task_queue = %address.task_queue,
            activity_type = %address.activity_type, node = address.node.as_deref(),
            reason = reason.as_str(),
            last_compatible_worker_left_secs_ago =
                census.last_compatible_departure.map(|age| age.as_secs()),
            detail = census.describe().unwrap_or_default(), "dispatches parked: queue unserved");
    }

    /// Every address with parked dispatches, with a census taken now.
    pub(crate) fn list(&self, registry: &Registry) -> Vec<UnservedQueue> {
        let now = Instant::now();
        let waiting: Vec<(UnservedAddress, UnservedReason, usize, Duration)> = self
            .lock()
            .iter()
            .map(|(address, episode)| {
                let oldest = episode
                    .parked
                    .keys()
                    .next()
                    .map_or(Duration::ZERO, |at| now.saturating_duration_since(*at));
                (address.clone(), episode.reason, episode.waiting, oldest)
            })
            .collect();
        // The census is taken outside the book's lock; the registry has its own.
        let mut list: Vec<UnservedQueue> = waiting
            .into_iter()
            .map(|(address, last_reason, waiting, oldest_wait)| {
                let census = registry.pool_census(
                    &address.namespace,
                    &address.task_queue,
                    &address.activity_type,
                    address.node.as_deref(),
                );
                // A census that reads "served" means the waiters are being woken right now;
                // a local census cannot see the other nodes a cluster offer found full.
                let reason = match census.classify() {
                    _ if last_reason == UnservedReason::NoCapacityInCluster => last_reason,
                    Some(reason) => reason,
                    None => last_reason,
                };
                UnservedQueue {
                    address,
                    reason,
                    census,
                    waiting,
                    oldest_wait,
                }
            })
            .collect();
        list.sort_by(|a, b| a.address.cmp(&b.address));
        list
    }

    /// How many episodes have logged their WARN since start.
    #[cfg(test)]
    pub(crate) fn warnings(&self) -> u64 {
        self.warnings.load(Ordering::Relaxed)
    }

    fn unpark(&self, address: &UnservedAddress, parked_at: Instant) {
        let mut book = self.lock();
        let Some(episode) = book.get_mut(address) else {
            return;
        };
        episode.waiting = episode.waiting.saturating_sub(1);
        if let Some(count) = episode.parked.get_mut(&parked_at) {
            *count -= 1;
            if *count == 0 {
                episode.parked.remove(&parked_at);
            }
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
    /// Records a fresh classification for this ticket's address.
    pub(crate) fn reclassify(&self, reason: UnservedReason, census: &PoolCensus) {
        self.book.reclassify(&self.address, reason, census);
    }
}

impl Drop for ParkTicket {
    fn drop(&mut self) {
        self.book.unpark(&self.address, self.parked_at);
    }
}
