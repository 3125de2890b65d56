//! The origin's capacity hints: what wakes a dispatch parked `no capacity in cluster`.
//!
//! Each pool counts the capacity announcements this node has heard for it (a generation), and
//! so does the cluster for nodes joining. A hint remembers both counts when it is taken, which
//! the dispatcher does as the offer leaves, and resolves once either has moved: an
//! announcement heard while the offer was out (before its "no taker" came back) wakes the
//! dispatch at once instead of being lost. A waker alone (`Notify::notify_waiters`) would wake
//! only the waiters registered at that moment, and a dispatch registers after its answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::id_hash::IdHash;

/// Pools whose announcements are tracked before the ones no hint waits on are forgotten.
const TRACKED_POOLS: usize = 1024;

/// A count of announcements and the waker of those waiting for the next.
#[derive(Debug, Default)]
struct Generation {
    heard: AtomicU64,
    notify: Notify,
}

impl Generation {
    fn now(&self) -> u64 {
        self.heard.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.heard.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }

    /// Resolves once the count is no longer `seen`.
    async fn moved_from(&self, seen: u64) {
        loop {
            // Created before the check, so a bump between the two still wakes it.
            let notified = self.notify.notified();
            if self.now() != seen {
                return;
            }
            notified.await;
        }
    }
}

/// Per pool ([`pool_key`](crate::names::pool_key)), the announcements heard; and the nodes
/// joined.
#[derive(Debug, Default)]
pub(crate) struct Hints {
    pools: Mutex<HashMap<u64, Arc<Generation>, IdHash>>,
    joined: Arc<Generation>,
}

impl Hints {
    fn pool(&self, pool: u64) -> Arc<Generation> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(generation) = pools.get(&pool) {
            return Arc::clone(generation);
        }
        if pools.len() >= TRACKED_POOLS {
            // A pool no hint holds has nobody to wake: its count can start again.
            pools.retain(|_, generation| Arc::strong_count(generation) > 1);
        }
        Arc::clone(pools.entry(pool).or_default())
    }

    /// A node announced a free slot in `pool`: wakes the hints taken before it.
    pub(crate) fn announced(&self, pool: u64) {
        let generation = self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&pool)
            .cloned();
        // A pool nobody holds a hint for has nobody to wake.
        if let Some(generation) = generation {
            generation.bump();
        }
    }

    /// A node joined: wakes every hint taken before it.
    pub(crate) fn joined(&self) {
        self.joined.bump();
    }

    /// A hint for `pool` taken now: resolves once the pool hears an announcement or a node
    /// joins after this call, or `fallback` after its first poll (an announcement lost on the
    /// way, NATS restarting, say).
    pub(crate) fn hint(
        &self,
        pool: u64,
        fallback: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        let pool = self.pool(pool);
        let joined = Arc::clone(&self.joined);
        let (pool_seen, joined_seen) = (pool.now(), joined.now());
        async move {
            tokio::select! {
                () = pool.moved_from(pool_seen) => {}
                () = joined.moved_from(joined_seen) => {}
                () = tokio::time::sleep(fallback) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    const FALLBACK: Duration = Duration::from_secs(5);
    const P: u64 = 1;
    const Q: u64 = 2;

    #[tokio::test(start_paused = true)]
    async fn an_announcement_heard_while_the_offer_is_out_wakes_its_hint_at_once() {
        let hints = Hints::default();
        // The offer leaves: its hint is taken, not yet polled (its answer is on the way).
        let mut hint = Box::pin(hints.hint(P, FALLBACK));
        // The announcement arrives before the "no taker" answer.
        hints.announced(P);
        // The answer is "no taker": the dispatch waits on the hint, which is ready at once.
        assert!(
            hint.as_mut().now_or_never().is_some(),
            "an announcement between the offer and its answer is not lost"
        );
        // Control: a hint taken after the announcement waits for the next one.
        let mut later = Box::pin(hints.hint(P, FALLBACK));
        assert!(later.as_mut().now_or_never().is_none());
        hints.announced(P);
        assert!(later.as_mut().now_or_never().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn only_its_own_pool_or_a_node_joining_wakes_a_hint() {
        let hints = Hints::default();
        let mut hint = Box::pin(hints.hint(P, FALLBACK));
        hints.announced(Q);
        assert!(
            hint.as_mut().now_or_never().is_none(),
            "another pool's slot"
        );
        hints.joined();
        assert!(hint.as_mut().now_or_never().is_some(), "a node joined");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hint_nothing_wakes_resolves_after_its_fallback() {
        let hints = Hints::default();
        let mut hint = Box::pin(hints.hint(P, FALLBACK));
        assert!(hint.as_mut().now_or_never().is_none());
        tokio::time::advance(FALLBACK).await;
        assert!(
            hint.as_mut().now_or_never().is_some(),
            "the periodic re-offer"
        );
    }
}
