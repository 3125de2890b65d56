//! The origin's offer queues: dispatches parked on one pool wait here to be offered together,
//! one NATS request for up to [`MAX_BATCH`](crate::wire::MAX_BATCH) of them. Plain data behind a lock; the sending is
//! [`crate::forward`]'s.
//!
//! A pool has up to [`OPEN_IN_FLIGHT`] batches out at once, and up to [`MAX_IN_FLIGHT`] while
//! its answers are slow. The first dispatch to arrive at an idle pool is offered at once (a batch
//! of one: no added latency when the cluster is quiet); while batches are out, the dispatches
//! arriving meanwhile queue and leave together when one comes back. So under load k
//! dispatches share a request and its answer, and at low load nothing waits.
//!
//! The window: a taker holds its answer while the tasks it started may end within its linger
//! (their ends then ride in the answer), so answers come back within a round trip when tasks
//! are quick and after the linger when they are not. Quick answers keep two batches out (the
//! fewer out, the larger each one and the fewer NATS messages). Another sender starts, up to
//! [`MAX_IN_FLIGHT`], when a dispatch arrives and no batch has gone out (nor a sender started)
//! for [`WIDEN_AFTER`], and when a sender's answer took [`SLOW_ANSWER`] or more (its taker held
//! it for the linger) while dispatches still wait (so dispatches that all arrived at once widen
//! it too). While more than [`OPEN_IN_FLIGHT`] are out, a sender whose answer took something
//! and came back within [`WIDEN_AFTER`] gives its slot back. The time is the origin's, from taking a batch to
//! reading its answer: where a round trip alone takes [`WIDEN_AFTER`], answers are never quick
//! and a pool keeps up to [`MAX_IN_FLIGHT`] out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::id_hash::IdHash;
use crate::names::pool_key;
use crate::wire::{EntryAnswer, OfferEntry, OfferHeader};

/// The most input bytes one batch carries (a single larger input still goes, alone): well
/// under NATS's default `max_payload` of 1 MiB.
pub(crate) const BATCH_BYTES: usize = 256 * 1024;

/// The batches one pool has out at once while its answers come back quickly.
pub(crate) const OPEN_IN_FLIGHT: usize = 2;

/// The most batches one pool has out at once (while its answers are slow).
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// How long a pool goes without sending a batch before another sender starts, and the answer
/// time under which a sender beyond [`OPEN_IN_FLIGHT`] gives its slot back.
pub(crate) const WIDEN_AFTER: Duration = Duration::from_millis(1);

/// An answer this late was held by its taker for most of its 5 ms linger (the tasks outlast
/// it): with dispatches waiting, another sender starts. Shorter delays are the origin's and
/// the network's (a busy machine's scheduling), which more batches out would not help.
pub(crate) const SLOW_ANSWER: Duration = Duration::from_millis(4);

/// Pools whose queues are tracked before idle ones are forgotten.
const TRACKED_POOLS: usize = 1024;

/// One dispatch's offers so far, and whether a "busy" answer sends it round again.
#[derive(Debug)]
pub(crate) struct Tries {
    offers: usize,
    busy: usize,
    max_offers: usize,
    busy_retries: usize,
}

impl Tries {
    /// At most `max_offers` offers in all, and `busy_retries` answered "busy" by a batch that
    /// took nothing.
    pub(crate) fn new(max_offers: usize, busy_retries: usize) -> Self {
        Self {
            offers: 0,
            busy: 0,
            max_offers,
            busy_retries,
        }
    }

    /// Counts an offer going out; false when the dispatch has had its offers (it parks).
    pub(crate) fn offer(&mut self) -> bool {
        if self.offers >= self.max_offers || self.busy >= self.busy_retries {
            return false;
        }
        self.offers += 1;
        true
    }

    /// The offer was answered "busy"; `progress`: its batch had another forward taken. Only a
    /// batch that took nothing says the pool may be full everywhere.
    pub(crate) fn busy(&mut self, progress: bool) {
        if !progress {
            self.busy += 1;
        }
    }
}

/// What a queued dispatch learns of its offer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A taker's answer for this forward, with the taker's name; `progress` says whether the
    /// same batch had a forward taken (a "busy" in a partly taken batch is not the pool
    /// being full everywhere, just this taker).
    Answered {
        taker: Arc<str>,
        answer: EntryAnswer,
        progress: bool,
    },
    /// Nobody subscribes to the pool: no node has a free slot.
    NoResponders,
    /// No readable answer (lost, late or garbled): someone may have taken it.
    Unanswered,
}

/// One dispatch waiting for a batch.
#[derive(Debug)]
pub(crate) struct Queued {
    pub(crate) entry: OfferEntry,
    pub(crate) heard: oneshot::Sender<Heard>,
}

/// A pool's address as a dispatch carries it (task queue normalised, empty node as none):
/// borrowed, so finding its queue copies nothing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Address<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) task_queue: &'a str,
    pub(crate) activity_type: &'a str,
    pub(crate) node: Option<&'a str>,
}

impl Address<'_> {
    /// The pool's key ([`pool_key`]): the queues' hash, and the offer subject in hex.
    pub(crate) fn key(&self) -> u64 {
        pool_key(
            self.namespace,
            self.task_queue,
            self.activity_type,
            self.node,
        )
    }

    fn is(&self, header: &OfferHeader) -> bool {
        header.namespace == self.namespace
            && header.task_queue == self.task_queue
            && header.activity_type == self.activity_type
            && header.node.as_deref() == self.node
    }

    fn header(&self, origin: &str) -> OfferHeader {
        OfferHeader {
            origin: origin.to_owned(),
            namespace: self.namespace.to_owned(),
            task_queue: self.task_queue.to_owned(),
            activity_type: self.activity_type.to_owned(),
            node: self.node.map(str::to_owned),
        }
    }
}

/// A pool's queue as a dispatch holds on to it between offers: its key and the header its
/// batches carry (shared with the queue, so a dispatch copies no name).
#[derive(Clone, Debug)]
pub(crate) struct PoolRef {
    key: u64,
    pub(crate) header: Arc<OfferHeader>,
}

/// One pool's queue and its batches out.
#[derive(Debug)]
pub(crate) struct PoolQueue {
    header: Arc<OfferHeader>,
    pub(crate) subject: String,
    waiting: VecDeque<Queued>,
    /// Senders holding a batch slot.
    in_flight: usize,
    /// When the last batch went out (or the last sender started).
    last_sent: Option<Instant>,
}

impl PoolQueue {
    fn new(header: Arc<OfferHeader>, subject: String) -> Self {
        Self {
            header,
            subject,
            waiting: VecDeque::new(),
            in_flight: 0,
            last_sent: None,
        }
    }

    /// Queues `queued` at `now`; true when the caller must start a sender for the pool, which
    /// then owns one batch slot: fewer than [`OPEN_IN_FLIGHT`] batches are out, or fewer than
    /// [`MAX_IN_FLIGHT`] and none went out for [`WIDEN_AFTER`] (the ones out are slow).
    pub(crate) fn push(&mut self, queued: Queued, now: Instant) -> bool {
        self.waiting.push_back(queued);
        let slow = self
            .last_sent
            .is_some_and(|sent| now.saturating_duration_since(sent) >= WIDEN_AFTER);
        if self.in_flight < OPEN_IN_FLIGHT || (self.in_flight < MAX_IN_FLIGHT && slow) {
            self.in_flight += 1;
            // The new sender's batch goes out now: the next widening waits for another
            // silence, however long the pool was idle before.
            self.last_sent = Some(now);
            return true;
        }
        false
    }

    /// The next batch for a sender holding a batch slot at `now`, whose last batch was
    /// answered in `answered_in` (`None` for a sender's first, and for an answer that took
    /// nothing: a full taker's "busy" says nothing of the pool's pace): up to `max` queued
    /// dispatches whose caller still waits, with at most [`BATCH_BYTES`] of input unless the first alone
    /// has more. `None` gives the slot back: nothing is waiting, or the sender is beyond
    /// [`OPEN_IN_FLIGHT`] and was answered within [`WIDEN_AFTER`] (the others suffice).
    pub(crate) fn next_batch(
        &mut self,
        max: usize,
        now: Instant,
        answered_in: Option<Duration>,
    ) -> Option<Vec<Queued>> {
        let quick = answered_in.is_some_and(|answered_in| answered_in < WIDEN_AFTER);
        if self.in_flight > OPEN_IN_FLIGHT && quick {
            self.in_flight -= 1;
            return None;
        }
        let mut batch: Vec<Queued> = Vec::new();
        let mut bytes = 0usize;
        while batch.len() < max {
            let Some(next) = self.waiting.front() else {
                break;
            };
            let size = next.entry.input.len();
            if !batch.is_empty() && bytes.saturating_add(size) > BATCH_BYTES {
                break;
            }
            let Some(queued) = self.waiting.pop_front() else {
                break;
            };
            // A dispatch that stopped waiting (cancelled, deadline) is not offered.
            if !queued.heard.is_closed() {
                bytes = bytes.saturating_add(size);
                batch.push(queued);
            }
        }
        if batch.is_empty() {
            self.in_flight = self.in_flight.saturating_sub(1);
            return None;
        }
        self.last_sent = Some(now);
        Some(batch)
    }

    /// After a sender whose answer took `answered_in` took its next batch at `now`: true when
    /// that answer was slow ([`SLOW_ANSWER`] or more), dispatches still wait and fewer than
    /// [`MAX_IN_FLIGHT`] batches are out; the slot is counted and the caller starts a sender.
    pub(crate) fn widen_after_answer(
        &mut self,
        answered_in: Option<Duration>,
        now: Instant,
    ) -> bool {
        let slow = answered_in.is_some_and(|answered_in| answered_in >= SLOW_ANSWER);
        if slow && !self.waiting.is_empty() && self.in_flight < MAX_IN_FLIGHT {
            self.in_flight += 1;
            self.last_sent = Some(now);
            return true;
        }
        false
    }

    fn idle(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty()
    }
}

/// Every pool's queue, by pool key (pools whose keys collide share an entry, told apart by
/// their header).
#[derive(Debug, Default)]
pub(crate) struct OfferQueues {
    pools: HashMap<u64, Vec<PoolQueue>, IdHash>,
}

impl OfferQueues {
    /// The queue of `address` for dispatches from `origin`, created with `subject` when new;
    /// finding a tracked pool (every dispatch after its pool's first) copies nothing.
    pub(crate) fn find(
        &mut self,
        origin: &str,
        address: Address<'_>,
        subject: impl FnOnce(u64) -> String,
    ) -> PoolRef {
        let key = address.key();
        if let Some(pool) = self
            .pools
            .get(&key)
            .and_then(|pools| pools.iter().find(|pool| address.is(&pool.header)))
        {
            return PoolRef {
                key,
                header: Arc::clone(&pool.header),
            };
        }
        let header = Arc::new(address.header(origin));
        self.insert(key, PoolQueue::new(Arc::clone(&header), subject(key)));
        PoolRef { key, header }
    }

    fn insert(&mut self, key: u64, pool: PoolQueue) {
        if !self.pools.contains_key(&key) && self.pools.len() >= TRACKED_POOLS {
            self.pools.retain(|_, pools| {
                pools.retain(|pool| !pool.idle());
                !pools.is_empty()
            });
        }
        self.pools.entry(key).or_default().push(pool);
    }

    /// Queues `queued` in `pool`'s queue (created again with `subject` if it was forgotten
    /// while idle); true when the caller must start a sender (see [`PoolQueue::push`]) at `now`.
    pub(crate) fn push(
        &mut self,
        pool: &PoolRef,
        queued: Queued,
        now: Instant,
        subject: impl FnOnce(u64) -> String,
    ) -> bool {
        if let Some(queue) = self.get_mut(pool) {
            return queue.push(queued, now);
        }
        let mut queue = PoolQueue::new(Arc::clone(&pool.header), subject(pool.key));
        let start = queue.push(queued, now);
        self.insert(pool.key, queue);
        start
    }

    /// `pool`'s queue, if it is tracked.
    pub(crate) fn get_mut(&mut self, pool: &PoolRef) -> Option<&mut PoolQueue> {
        self.pools
            .get_mut(&pool.key)?
            .iter_mut()
            .find(|queue| Arc::ptr_eq(&queue.header, &pool.header) || *queue.header == *pool.header)
    }
}

/// What each dispatch of a batch hears from the taker's answer: its own entry, or "busy" for
/// a forward the answer leaves out (the taker did not start it).
pub(crate) fn hear(
    taker: &str,
    answers: Vec<(u64, EntryAnswer)>,
    batch: &[OfferEntry],
) -> Vec<Heard> {
    let progress = answers
        .iter()
        .any(|(_, answer)| !matches!(answer, EntryAnswer::Busy));
    let taker: Arc<str> = Arc::from(taker);
    let heard = |answer| Heard::Answered {
        taker: Arc::clone(&taker),
        answer,
        progress,
    };
    // A taker answers in the batch's order: matched in place, without a map.
    let in_order = answers.len() == batch.len()
        && answers
            .iter()
            .zip(batch)
            .all(|((forward, _), entry)| *forward == entry.forward);
    if in_order {
        return answers
            .into_iter()
            .map(|(_, answer)| heard(answer))
            .collect();
    }
    let mut by_forward: HashMap<u64, EntryAnswer> = answers.into_iter().collect();
    batch
        .iter()
        .map(|entry| {
            heard(
                by_forward
                    .remove(&entry.forward)
                    .unwrap_or(EntryAnswer::Busy),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::wire::{MAX_BATCH, RemoteEnd};

    fn address() -> Address<'static> {
        Address {
            namespace: "ns",
            task_queue: "q",
            activity_type: "act",
            node: None,
        }
    }

    /// The queue of the test pool, created on first use.
    fn pool(queues: &mut OfferQueues) -> &mut PoolQueue {
        let pool = queues.find("a", address(), |_| "offer.p".to_owned());
        queues.get_mut(&pool).expect("just found")
    }

    fn queued(forward: u64) -> (Queued, oneshot::Receiver<Heard>) {
        sized(forward, 0)
    }

    fn sized(forward: u64, size: usize) -> (Queued, oneshot::Receiver<Heard>) {
        let (heard, receiver) = oneshot::channel();
        let entry = OfferEntry {
            forward,
            timeout_ms: 1000,
            attempt_offset: 0,
            input: Bytes::from(vec![0; size]),
        };
        (Queued { entry, heard }, receiver)
    }

    fn forwards(batch: &[Queued]) -> Vec<u64> {
        batch.iter().map(|q| q.entry.forward).collect()
    }

    /// A moment after `start` (the tests' clock: they run in no runtime).
    fn at(start: Instant, micros: u64) -> Instant {
        start + Duration::from_micros(micros)
    }

    #[test]
    fn an_idle_pool_sends_at_once_and_a_busy_one_gathers_a_batch() {
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        let start = Instant::now();
        let mut receivers = Vec::new();
        // The first OPEN_IN_FLIGHT dispatches each start a sender, with a batch of one.
        for forward in 0..OPEN_IN_FLIGHT as u64 {
            let (q, r) = queued(forward);
            receivers.push(r);
            assert!(pool.push(q, start), "a free batch slot starts a sender");
            let batch = pool.next_batch(MAX_BATCH, start, None).expect("one waits");
            assert_eq!(forwards(&batch), vec![forward]);
        }
        // Every open slot is out and a batch went out just now: the next ones queue ...
        for forward in 10..15 {
            let (q, r) = queued(forward);
            receivers.push(r);
            assert!(
                !pool.push(q, at(start, 100)),
                "no sender while every open batch slot is out"
            );
        }
        // ... and leave together with the next sender's batch, capped at its max.
        let quick = Some(Duration::from_micros(200));
        let batch = pool.next_batch(3, at(start, 200), quick).expect("queued");
        assert_eq!(forwards(&batch), vec![10, 11, 12]);
        let batch = pool.next_batch(3, at(start, 200), quick).expect("queued");
        assert_eq!(forwards(&batch), vec![13, 14]);
        // Control: with nothing left the sender gives its slot back, and the next dispatch
        // starts a sender again.
        assert!(pool.next_batch(3, at(start, 300), quick).is_none());
        let (q, _r) = queued(20);
        assert!(pool.push(q, at(start, 300)));
    }

    #[test]
    fn a_pool_whose_answers_are_slow_widens_to_its_most_and_narrows_when_they_are_quick() {
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        let start = Instant::now();
        let mut receivers = Vec::new();
        let mut push = |pool: &mut PoolQueue, forward: u64, micros: u64| {
            let (q, r) = queued(forward);
            receivers.push(r);
            pool.push(q, at(start, micros))
        };
        for forward in 0..OPEN_IN_FLIGHT as u64 {
            assert!(push(pool, forward, 0));
            assert!(pool.next_batch(1, start, None).is_some());
        }
        // Control: a pool that sent a batch less than WIDEN_AFTER ago does not widen.
        assert!(!push(pool, 10, 999));
        // No batch went out for WIDEN_AFTER: another sender starts, and one more after
        // another WIDEN_AFTER, up to MAX_IN_FLIGHT.
        let widen = u64::try_from(WIDEN_AFTER.as_micros()).expect("small");
        let mut now = 0;
        for extra in 0..(MAX_IN_FLIGHT - OPEN_IN_FLIGHT) as u64 {
            now += widen;
            assert!(push(pool, 20 + extra, now), "slow answers widen the window");
            assert!(!push(pool, 30 + extra, now + widen / 2), "one per silence");
        }
        assert_eq!(pool.in_flight, MAX_IN_FLIGHT);
        assert!(
            !push(pool, 40, now + 10 * widen),
            "never beyond MAX_IN_FLIGHT"
        );
        // A sender answered slowly keeps its slot while dispatches wait ...
        let slow = Some(WIDEN_AFTER * 5);
        assert!(pool.next_batch(1, at(start, now + widen), slow).is_some());
        // ... one answered quickly beyond the open window gives it back though some wait ...
        let quick = Some(WIDEN_AFTER / 5);
        for _ in OPEN_IN_FLIGHT..MAX_IN_FLIGHT {
            assert!(pool.next_batch(1, at(start, now + widen), quick).is_none());
        }
        assert_eq!(pool.in_flight, OPEN_IN_FLIGHT);
        // ... and the open ones go on sending.
        assert!(pool.next_batch(1, at(start, now + widen), quick).is_some());
        assert_eq!(pool.in_flight, OPEN_IN_FLIGHT);
        // Control: a sender with no answer to judge by (an answer that took nothing) keeps
        // its slot beyond the open window.
        now += 3 * widen;
        assert!(push(pool, 50, now), "widened again");
        assert!(pool.next_batch(1, at(start, now), None).is_some());
        assert_eq!(pool.in_flight, OPEN_IN_FLIGHT + 1);
    }

    /// Queues forward `forward` in `pool` at `now`, keeping its receiver in `keep`; true when a
    /// sender must start.
    fn arrive(
        pool: &mut PoolQueue,
        keep: &mut Vec<oneshot::Receiver<Heard>>,
        forward: u64,
        now: Instant,
    ) -> bool {
        let (q, r) = queued(forward);
        keep.push(r);
        pool.push(q, now)
    }

    #[test]
    fn a_batch_going_out_restarts_the_silence_that_widens() {
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        let start = Instant::now();
        let mut keep = Vec::new();
        for forward in 0..OPEN_IN_FLIGHT as u64 {
            assert!(arrive(pool, &mut keep, forward, start));
        }
        assert!(pool.next_batch(1, start, None).is_some());
        // The other sender's batch goes out 0.8 ms later ...
        assert!(!arrive(pool, &mut keep, 10, at(start, 100)));
        assert!(pool.next_batch(1, at(start, 800), None).is_some());
        // ... so 1.2 ms after the start the pool has been silent only 0.4 ms: no widening.
        assert!(
            !arrive(pool, &mut keep, 11, at(start, 1_200)),
            "a batch went out 0.4 ms ago"
        );
        // Control: 1 ms after that batch it widens.
        assert!(arrive(pool, &mut keep, 12, at(start, 1_800)));
    }

    #[test]
    fn a_slow_answer_with_dispatches_waiting_widens_without_a_new_arrival() {
        let start = Instant::now();
        let mut keep = Vec::new();
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        // Everything arrives at once: two senders start, the rest queue.
        for forward in 0..10 {
            arrive(pool, &mut keep, forward, start);
        }
        assert_eq!(pool.in_flight, OPEN_IN_FLIGHT);
        let slow = Some(SLOW_ANSWER);
        let later = at(start, 5_000);
        assert!(pool.next_batch(1, later, slow).is_some());
        assert!(
            pool.widen_after_answer(slow, later),
            "slow, and dispatches wait"
        );
        assert!(pool.widen_after_answer(slow, later));
        assert_eq!(pool.in_flight, MAX_IN_FLIGHT);
        assert!(
            !pool.widen_after_answer(slow, later),
            "never beyond MAX_IN_FLIGHT"
        );
        // Controls: a quick answer, an answer that took nothing, and an empty queue do not
        // widen.
        let mut queues = OfferQueues::default();
        let pool = self::pool(&mut queues);
        arrive(pool, &mut keep, 20, start);
        arrive(pool, &mut keep, 21, start);
        assert!(!pool.widen_after_answer(Some(SLOW_ANSWER / 2), later));
        assert!(!pool.widen_after_answer(None, later));
        assert!(pool.next_batch(2, later, slow).is_some());
        assert!(!pool.widen_after_answer(slow, later), "nothing waits");
    }

    #[test]
    fn a_pool_is_found_by_its_address_and_one_forgotten_while_idle_comes_back() {
        let mut queues = OfferQueues::default();
        let mut made = 0;
        let first = queues.find("a", address(), |_| {
            made += 1;
            "offer.p".to_owned()
        });
        assert_eq!(first.header.origin, "a");
        assert_eq!(first.header.namespace, "ns");
        let again = queues.find("a", address(), |_| unreachable!("tracked"));
        assert!(
            Arc::ptr_eq(&first.header, &again.header),
            "one queue per pool"
        );
        // Control: another node pin is another pool.
        let pinned = Address {
            node: Some("n1"),
            ..address()
        };
        let other = queues.find("a", pinned, |_| {
            made += 1;
            "offer.q".to_owned()
        });
        assert_eq!(made, 2);
        assert!(!Arc::ptr_eq(&first.header, &other.header));
        assert_eq!(other.header.node.as_deref(), Some("n1"));
        // A pool forgotten while idle is queued in again by a dispatch still holding it.
        queues.pools.clear();
        let (q, _r) = queued(1);
        assert!(queues.push(&first, q, Instant::now(), |_| "offer.p".to_owned()));
        assert_eq!(
            queues.get_mut(&again).map(|pool| pool.subject.as_str()),
            Some("offer.p")
        );
    }

    #[test]
    fn a_batch_stops_at_its_byte_budget_but_a_large_input_still_goes_alone() {
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        let start = Instant::now();
        let mut keep = Vec::new();
        for (forward, size) in [
            (1, BATCH_BYTES * 2),
            (2, BATCH_BYTES / 2),
            (3, BATCH_BYTES / 2),
        ] {
            let (q, r) = sized(forward, size);
            keep.push(r);
            pool.push(q, start);
        }
        let (q, r) = sized(4, 1);
        keep.push(r);
        pool.push(q, start);
        assert_eq!(
            forwards(&pool.next_batch(MAX_BATCH, start, None).expect("big")),
            vec![1]
        );
        assert_eq!(
            forwards(&pool.next_batch(MAX_BATCH, start, None).expect("two halves")),
            vec![2, 3],
            "exactly at the budget"
        );
        // Control: what is left fits and goes.
        assert_eq!(
            forwards(&pool.next_batch(MAX_BATCH, start, None).expect("small")),
            vec![4]
        );
    }

    #[test]
    fn busy_in_a_partly_taken_batch_offers_again_and_busy_everywhere_parks() {
        let mut tries = Tries::new(5, 2);
        assert!(tries.offer());
        tries.busy(true);
        assert!(
            tries.offer(),
            "the taker filled up taking others: offer again"
        );
        tries.busy(true);
        assert!(tries.offer());
        tries.busy(false);
        assert!(
            tries.offer(),
            "one batch that took nothing is not yet enough"
        );
        tries.busy(false);
        // Control: the second batch that took nothing parks the dispatch.
        assert!(!tries.offer());
        // And progress alone is bounded too.
        let mut tries = Tries::new(3, 2);
        for _ in 0..3 {
            assert!(tries.offer());
            tries.busy(true);
        }
        assert!(!tries.offer(), "at most max_offers");
    }

    #[test]
    fn a_dispatch_that_stopped_waiting_is_not_offered() {
        let mut queues = OfferQueues::default();
        let pool = pool(&mut queues);
        let (first, _keep) = queued(1);
        let (gone, dropped) = queued(2);
        let (last, _keep_too) = queued(3);
        let start = Instant::now();
        pool.push(first, start);
        pool.push(gone, start);
        pool.push(last, start);
        drop(dropped);
        let batch = pool.next_batch(MAX_BATCH, start, None).expect("two wait");
        assert_eq!(forwards(&batch), vec![1, 3]);
    }

    #[test]
    fn a_partly_taken_batch_hears_busy_with_progress_and_a_left_out_forward_is_busy() {
        let batch: Vec<OfferEntry> = (1..=4).map(|f| queued(f).0.entry).collect();
        let answers = vec![
            (1, EntryAnswer::Taken),
            (2, EntryAnswer::Ended(RemoteEnd::Lost)),
            (3, EntryAnswer::Busy),
        ];
        let heard = hear("n2", answers, &batch);
        let answer = |n: usize| match &heard[n] {
            Heard::Answered {
                answer, progress, ..
            } => (answer.clone(), *progress),
            other => panic!("{other:?}"),
        };
        assert_eq!(answer(0), (EntryAnswer::Taken, true));
        assert_eq!(answer(1), (EntryAnswer::Ended(RemoteEnd::Lost), true));
        assert_eq!(answer(2), (EntryAnswer::Busy, true));
        assert_eq!(answer(3), (EntryAnswer::Busy, true), "left out: not taken");
        // Answered in another order than the batch's, each forward still hears its own.
        let shuffled = vec![
            (4, EntryAnswer::Busy),
            (2, EntryAnswer::Taken),
            (1, EntryAnswer::Busy),
            (3, EntryAnswer::Busy),
        ];
        let heard = hear("n2", shuffled, &batch);
        let answers: Vec<EntryAnswer> = heard
            .into_iter()
            .map(|heard| match heard {
                Heard::Answered { answer, .. } => answer,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            answers,
            vec![
                EntryAnswer::Busy,
                EntryAnswer::Taken,
                EntryAnswer::Busy,
                EntryAnswer::Busy
            ]
        );
        // Control: a batch answered all busy made no progress.
        let heard = hear("n2", vec![(1, EntryAnswer::Busy)], &batch[..1]);
        assert!(matches!(
            heard[0],
            Heard::Answered {
                progress: false,
                ..
            }
        ));
    }

    /// `docs/cluster.md`, "Batched offers": at most 4 offer requests out per pool, each with
    /// up to 256 KiB of input.
    #[test]
    fn the_batch_bounds_are_the_documented_ones() {
        assert_eq!(OPEN_IN_FLIGHT, 2);
        assert_eq!(MAX_IN_FLIGHT, 4);
        assert_eq!(WIDEN_AFTER, Duration::from_millis(1));
        assert_eq!(SLOW_ANSWER, Duration::from_millis(4));
        assert_eq!(BATCH_BYTES, 256 * 1024);
    }
}
