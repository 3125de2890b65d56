//! Which pools this node has a free slot for, and when to hold or drop its offer subscription
//! for each: plain data, driven by registry snapshots and the time.
//!
//! A node subscribes to a pool's offer subject as soon as it has a free slot there, and drops
//! the subscription only after the pool has stayed full for [`Subscriptions::hold`]: a pool
//! whose slots free and fill many times a second keeps one subscription rather than churning
//! it. Offers that reach a node whose pool just filled are answered "busy".

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use switchyard_core::WorkerSnapshot;
use tokio::time::Instant;

use crate::names::pool_hash;

/// Free slots per pool hash: every eligible worker's unused capacity, counted for each
/// `(namespace, task queue, activity type)` it serves, and again with its node label.
pub(crate) fn free_slots(workers: &[WorkerSnapshot]) -> HashMap<String, u32> {
    let mut free: HashMap<String, u32> = HashMap::new();
    for snapshot in workers {
        let Some(capacity) = snapshot.capacity else {
            continue;
        };
        let spare = capacity.saturating_sub(snapshot.in_flight);
        if spare == 0 || !snapshot.eligibility.is_eligible() {
            continue;
        }
        let worker = &snapshot.worker;
        let node = worker.node().map(|node| node.as_str());
        for namespace in worker.namespaces() {
            for activity in worker.activity_types() {
                let mut add = |node: Option<&str>| {
                    let key = pool_hash(namespace, worker.task_queue(), activity, node);
                    let slots = free.entry(key).or_default();
                    *slots = slots.saturating_add(spare);
                };
                add(None);
                if node.is_some() {
                    add(node);
                }
            }
        }
    }
    free
}

/// What to change in the node's offer subscriptions.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Pools gaining a subscription (they have a free slot now).
    pub(crate) subscribe: Vec<String>,
    /// Pools losing theirs (full, or gone, for the whole hold).
    pub(crate) unsubscribe: Vec<String>,
}

/// The node's offer subscriptions, with when each pool was last seen full.
#[derive(Debug)]
pub(crate) struct Subscriptions {
    held: HashMap<String, Option<Instant>>,
    hold: Duration,
}

impl Subscriptions {
    pub(crate) fn new(hold: Duration) -> Self {
        Self {
            held: HashMap::new(),
            hold,
        }
    }

    /// How long a pool stays full before its subscription goes.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> Duration {
        self.hold
    }

    /// The changes `free` calls for at `now`, applied to the table.
    pub(crate) fn plan(&mut self, free: &HashMap<String, u32>, now: Instant) -> Plan {
        let mut plan = Plan::default();
        for (pool, slots) in free {
            if *slots > 0 && !self.held.contains_key(pool) {
                self.held.insert(pool.clone(), None);
                plan.subscribe.push(pool.clone());
            }
        }
        let mut dropped = HashSet::new();
        for (pool, full_since) in &mut self.held {
            if free.get(pool).copied().unwrap_or(0) > 0 {
                *full_since = None;
                continue;
            }
            let since = *full_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= self.hold {
                dropped.insert(pool.clone());
            }
        }
        for pool in dropped {
            self.held.remove(&pool);
            plan.unsubscribe.push(pool);
        }
        plan.subscribe.sort();
        plan.unsubscribe.sort();
        plan
    }

    /// `pool`'s subscription ended without being asked to (the client refused it, or its
    /// stream closed): forgotten, so the next [`plan`](Self::plan) subscribes again while the
    /// pool has a free slot. Kept, it would read as held, and no offer for the pool would reach
    /// this node until the pool next stayed full for the whole hold.
    pub(crate) fn ended(&mut self, pool: &str) {
        self.held.remove(pool);
    }
}

/// How long a "busy" answer keeps its pool owed an announcement: as long as an origin whose
/// offer it turned away would otherwise wait before offering again.
pub(crate) const BUSY_OWED_FOR: Duration = Duration::from_secs(5);

/// Which pools to announce as having a free slot again: a pool whose free slots rose from
/// zero, or one this node answered "busy" for, at most once per [`Announcements::every`] each.
/// A rise inside that interval is owed, not dropped, and announced when it ends if the pool
/// still has a free slot: an origin whose offers all found the pool full waits for an
/// announcement. A busy answer owes one until a scan finds a free slot (for at most
/// [`BUSY_OWED_FOR`]): slots that free and fill between two scans never read zero, so no rise
/// would ever be seen, and the origin would wait out its re-offer period.
#[derive(Debug)]
pub(crate) struct Announcements {
    had_free: HashMap<String, u32>,
    announced: HashMap<String, Instant>,
    owed: HashSet<String>,
    busy: HashMap<String, Instant>,
    every: Duration,
}

impl Announcements {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            had_free: HashMap::new(),
            announced: HashMap::new(),
            owed: HashSet::new(),
            busy: HashMap::new(),
            every,
        }
    }

    /// This node answered an offer for `pool` "busy" at `at`.
    pub(crate) fn answered_busy(&mut self, pool: String, at: Instant) {
        self.busy.insert(pool, at);
    }

    /// The pools to announce now, given this scan's free slots at `now`.
    pub(crate) fn due(&mut self, free: &HashMap<String, u32>, now: Instant) -> Vec<String> {
        for (pool, slots) in free {
            if *slots > 0 && self.had_free.get(pool).copied().unwrap_or(0) == 0 {
                self.owed.insert(pool.clone());
            }
        }
        let every = self.every;
        self.announced
            .retain(|_, at| now.saturating_duration_since(*at) < every);
        let mut due = Vec::new();
        self.busy.retain(|pool, at| {
            if now.saturating_duration_since(*at) >= BUSY_OWED_FOR {
                return false;
            }
            if free.get(pool).copied().unwrap_or(0) == 0 || self.announced.contains_key(pool) {
                return true;
            }
            due.push(pool.clone());
            false
        });
        self.owed.retain(|pool| {
            if free.get(pool).copied().unwrap_or(0) == 0 {
                return false;
            }
            if due.contains(pool) {
                return false;
            }
            if self.announced.contains_key(pool) {
                return true;
            }
            due.push(pool.clone());
            false
        });
        for pool in &due {
            self.announced.insert(pool.clone(), now);
        }
        self.had_free.clone_from(free);
        due.sort();
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(pools: &[(&str, u32)]) -> HashMap<String, u32> {
        pools.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
    }

    #[test]
    fn subscribes_at_one_free_slot_and_unsubscribes_only_after_the_hold() {
        let start = Instant::now();
        let mut subs = Subscriptions::new(Duration::from_millis(500));
        let plan = subs.plan(&free(&[("p", 1), ("q", 0)]), start);
        assert_eq!(plan.subscribe, vec!["p".to_owned()], "q has no free slot");
        assert!(
            subs.plan(&free(&[("p", 2)]), start).subscribe.is_empty(),
            "held once"
        );
        // Full: kept through the hold (hysteresis) ...
        let full = free(&[("p", 0)]);
        assert_eq!(
            subs.plan(&full, start + Duration::from_millis(100)),
            Plan::default()
        );
        assert_eq!(
            subs.plan(&full, start + Duration::from_millis(400)),
            Plan::default()
        );
        // ... a free slot within it resets the clock ...
        assert_eq!(
            subs.plan(&free(&[("p", 1)]), start + Duration::from_millis(450)),
            Plan::default()
        );
        assert_eq!(
            subs.plan(&full, start + Duration::from_millis(500)),
            Plan::default()
        );
        // ... and full for the whole hold drops it.
        let later = start + Duration::from_millis(500) + subs.hold();
        assert_eq!(subs.plan(&full, later).unsubscribe, vec!["p".to_owned()]);
        // Control: a free slot again subscribes again.
        assert_eq!(
            subs.plan(&free(&[("p", 1)]), later).subscribe,
            vec!["p".to_owned()]
        );
    }

    #[test]
    fn a_subscription_that_ended_by_itself_is_taken_again_while_the_pool_has_a_free_slot() {
        let start = Instant::now();
        let mut subs = Subscriptions::new(Duration::from_millis(500));
        let one = free(&[("p", 1)]);
        assert_eq!(subs.plan(&one, start).subscribe, vec!["p".to_owned()]);
        // Control: a held subscription is not taken twice.
        assert_eq!(subs.plan(&one, start), Plan::default());
        subs.ended("p");
        assert_eq!(
            subs.plan(&one, start + Duration::from_millis(50)).subscribe,
            vec!["p".to_owned()],
            "taken again at the next scan"
        );
        // A full pool whose subscription ended is not taken again until a slot frees.
        subs.ended("p");
        assert_eq!(subs.plan(&free(&[("p", 0)]), start), Plan::default());
    }

    #[test]
    fn a_pool_that_vanished_counts_as_full() {
        let start = Instant::now();
        let mut subs = Subscriptions::new(Duration::from_millis(500));
        subs.plan(&free(&[("p", 1)]), start);
        let gone = HashMap::new();
        assert_eq!(subs.plan(&gone, start), Plan::default());
        assert_eq!(
            subs.plan(&gone, start + Duration::from_secs(1)).unsubscribe,
            vec!["p".to_owned()]
        );
    }

    #[test]
    fn a_pool_answered_busy_is_announced_at_the_first_scan_with_a_free_slot() {
        let every = Duration::from_secs(1);
        let start = Instant::now();
        let ms = |n| start + Duration::from_millis(n);
        let mut announce = Announcements::new(every);
        // The pool is seen with a free slot, announced once, and never reads zero again: its
        // slots free and fill between scans.
        assert_eq!(announce.due(&free(&[("p", 1)]), ms(0)), ["p"]);
        assert!(announce.due(&free(&[("p", 1)]), ms(1500)).is_empty());
        // Control: without a busy answer nothing more is announced.
        assert!(announce.due(&free(&[("p", 2)]), ms(2000)).is_empty());
        // A busy answer owes an announcement, made at the next scan that finds a free slot.
        announce.answered_busy("p".to_owned(), ms(2100));
        assert!(announce.due(&free(&[("p", 0)]), ms(2150)).is_empty());
        assert_eq!(announce.due(&free(&[("p", 1)]), ms(2200)), ["p"]);
        assert!(
            announce.due(&free(&[("p", 1)]), ms(2250)).is_empty(),
            "paid once"
        );
        // Inside the interval it waits for the interval to end.
        announce.answered_busy("p".to_owned(), ms(2300));
        assert!(announce.due(&free(&[("p", 1)]), ms(2350)).is_empty());
        assert_eq!(announce.due(&free(&[("p", 1)]), ms(3200)), ["p"]);
    }

    #[test]
    fn a_busy_debt_lapses_after_busy_owed_for() {
        // An interval longer than the debt: the debt cannot be paid inside it.
        let every = BUSY_OWED_FOR * 2;
        let start = Instant::now();
        let mut announce = Announcements::new(every);
        assert_eq!(announce.due(&free(&[("p", 1)]), start), ["p"]);
        announce.answered_busy("p".to_owned(), start);
        let almost = start + BUSY_OWED_FOR - Duration::from_millis(1);
        assert!(announce.due(&free(&[("p", 1)]), almost).is_empty());
        assert!(
            announce.due(&free(&[("p", 1)]), start + every).is_empty(),
            "lapsed"
        );
        // Control: a debt once the interval is over is paid at the next scan.
        announce.answered_busy("p".to_owned(), start + every);
        assert_eq!(announce.due(&free(&[("p", 1)]), start + every), ["p"]);
    }

    #[test]
    fn a_rise_inside_the_interval_is_announced_when_it_ends() {
        let every = Duration::from_secs(1);
        let start = Instant::now();
        let mut announce = Announcements::new(every);
        assert_eq!(
            announce.due(&free(&[("p", 1)]), start),
            vec!["p".to_owned()]
        );
        assert!(
            announce.due(&free(&[("p", 2)]), start).is_empty(),
            "no rise from zero"
        );
        announce.due(&free(&[("p", 0)]), start + Duration::from_millis(200));
        // Risen again inside the interval: owed, not sent ...
        assert!(
            announce
                .due(&free(&[("p", 1)]), start + Duration::from_millis(500))
                .is_empty()
        );
        // ... and sent once the interval is up, without another rise.
        assert_eq!(
            announce.due(&free(&[("p", 1)]), start + every),
            vec!["p".to_owned()]
        );
        // Control: a rise owed, then full again before the interval is up, owes nothing.
        let ms = |n| start + every + Duration::from_millis(n);
        announce.due(&free(&[("p", 0)]), ms(200));
        assert!(announce.due(&free(&[("p", 1)]), ms(500)).is_empty());
        announce.due(&free(&[("p", 0)]), ms(800));
        assert!(announce.due(&free(&[("p", 0)]), ms(1000)).is_empty());
        assert!(announce.due(&free(&[("p", 0)]), ms(3000)).is_empty());
    }
}
