//! [`PoolHistory`]: the console's recent past of each `(namespace, task queue)` pool: how many
//! dispatches ended per interval, with which outcomes, and their p50 / p99 latency.
//!
//! A bounded in-memory ring, no external database: [`BUCKETS`] intervals of [`BUCKET`] per
//! pool, at most [`MAX_POOLS`] pools (the one heard from least recently gives way). Latency is
//! kept in log-spaced bins ([`BINS_PER_OCTAVE`] per doubling, so a percentile is within about
//! 19 % of the true value) rather than as samples, so a busy pool costs the same memory as an
//! idle one.
//!
//! Intervals are aligned on wall-clock boundaries (a multiple of [`BUCKET`] since the Unix
//! epoch), so the rings of several nodes line up interval by interval and merge by summing
//! ([`Recorded`], [`merge`]): outcome counts add, and so do latency bins, from which the merged
//! percentiles are read (percentiles themselves cannot be added).
//!
//! Like the Prometheus recorder, the ring is process-wide ([`pool`], [`snapshot`]): the
//! producer API records each dispatch it ran, and the operations listener reads it. Each pool's
//! ring sits behind a lock of its own ([`PoolCell`]), and a producer holds on to the cell of the
//! pool it dispatches to ([`PoolHandles`]), so a dispatch records without naming its pool again
//! (no copy of the names, no lookup, no process-wide lock).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Length of one interval of the ring.
pub(crate) const BUCKET: Duration = Duration::from_secs(10);
/// Intervals kept per pool: ten minutes.
pub(crate) const BUCKETS: usize = 60;
/// Pools kept at once.
pub(crate) const MAX_POOLS: usize = 256;
/// Latency bins per doubling of the latency.
const BINS_PER_OCTAVE: f64 = 4.0;
/// Latency bins: from 1 µs to about 2^31 µs (36 minutes); longer lands in the last one.
const BINS: usize = 124;
/// [`BUCKET`] in milliseconds.
const BUCKET_MS: u64 = BUCKET.as_millis() as u64;

/// One interval of one pool.
#[derive(Clone, Debug)]
struct Bucket {
    /// Which interval since the ring's origin.
    index: u64,
    /// Dispatches ended, by outcome label.
    outcomes: BTreeMap<&'static str, u64>,
    /// Latency bin counts.
    latency: Box<[u32; BINS]>,
}

impl Bucket {
    fn new(index: u64) -> Self {
        Self {
            index,
            outcomes: BTreeMap::new(),
            latency: Box::new([0; BINS]),
        }
    }

    /// The bucket as [`Recorded`] carries it: latency bins listed only when not empty.
    fn recorded(&self) -> RecordedBucket {
        RecordedBucket {
            index: self.index,
            outcomes: self
                .outcomes
                .iter()
                .map(|(label, &n)| ((*label).to_owned(), n))
                .collect(),
            latency: self
                .latency
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(bin, &n)| (bin, u64::from(n)))
                .collect(),
        }
    }
}

/// The upper bound of the bin holding the `q` quantile of `latency` (counts per bin), in
/// milliseconds. Counts summed from other nodes are peer input: sums saturate.
fn quantile_ms(latency: &[u64; BINS], q: f64) -> Option<f64> {
    let total = saturating_sum(latency.iter().copied());
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0u64;
    for (bin, &count) in latency.iter().enumerate() {
        seen = seen.saturating_add(count);
        if seen >= rank {
            return Some(bin_upper_micros(bin) / 1000.0);
        }
    }
    None
}

fn saturating_sum(counts: impl Iterator<Item = u64>) -> u64 {
    counts.fold(0, u64::saturating_add)
}

/// The bin of a latency.
fn bin(latency: Duration) -> usize {
    let micros = latency.as_secs_f64() * 1e6;
    if micros <= 1.0 {
        return 0;
    }
    ((micros.log2() * BINS_PER_OCTAVE).floor() as usize).min(BINS - 1)
}

/// The largest latency a bin holds, in microseconds.
fn bin_upper_micros(bin: usize) -> f64 {
    ((bin as f64 + 1.0) / BINS_PER_OCTAVE).exp2()
}

/// One pool's ring: buckets in increasing index order, none older than [`BUCKETS`].
#[derive(Clone, Debug, Default)]
struct Ring {
    buckets: VecDeque<Bucket>,
}

impl Ring {
    fn latest(&self) -> Option<u64> {
        self.buckets.back().map(|b| b.index)
    }

    /// The bucket of interval `index`, the newest. A caller that read the clock just before
    /// another took the lock may be an interval late; it counts in the newest one.
    fn bucket(&mut self, index: u64) -> Option<&mut Bucket> {
        if self.latest().is_none_or(|latest| latest < index) {
            self.buckets.push_back(Bucket::new(index));
            self.expire(index);
        }
        self.buckets.back_mut()
    }

    /// Drops buckets that fell out of the window ending at `index`.
    fn expire(&mut self, index: u64) {
        let oldest = index.saturating_sub(BUCKETS as u64 - 1);
        while self.buckets.front().is_some_and(|b| b.index < oldest) {
            self.buckets.pop_front();
        }
    }
}

/// One interval of a pool as the console draws it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Point {
    /// Dispatches that ended in the interval.
    pub(crate) dispatches: u64,
    /// Of those, by outcome label.
    pub(crate) outcomes: BTreeMap<String, u64>,
    /// Median latency in milliseconds (upper bound of its bin), when any ended.
    pub(crate) p50_ms: Option<f64>,
    /// 99th percentile latency in milliseconds, likewise.
    pub(crate) p99_ms: Option<f64>,
}

/// One pool's last [`BUCKETS`] intervals, oldest first, the last one the current interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct PoolSeries {
    /// Namespace.
    pub(crate) namespace: String,
    /// Task queue.
    pub(crate) task_queue: String,
    /// One point per interval; empty intervals are zero.
    pub(crate) points: Vec<Point>,
    /// In a cluster: the gateway nodes whose producers ended dispatches of the pool in the
    /// window (absent outside a cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gateway_nodes: Option<Vec<String>>,
}

/// One interval of one pool as a node sends it to another: the counts, not the percentiles.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RecordedBucket {
    /// Which wall-clock interval: the bucket holds `[index, index + 1) × BUCKET` since the
    /// Unix epoch.
    pub(crate) index: u64,
    /// Dispatches ended, by outcome label.
    pub(crate) outcomes: BTreeMap<String, u64>,
    /// `(bin, count)` of the latency bins that are not empty.
    pub(crate) latency: Vec<(usize, u64)>,
}

/// One pool's recorded intervals, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RecordedPool {
    /// Namespace.
    pub(crate) namespace: String,
    /// Task queue.
    pub(crate) task_queue: String,
    /// The intervals in which the pool ended a dispatch.
    pub(crate) buckets: Vec<RecordedBucket>,
}

/// One node's history over its window, as counts and bins: what [`merge`] sums.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Recorded {
    /// The window's first interval (the node's start, or [`BUCKETS`] intervals back).
    pub(crate) first: u64,
    /// The window's last interval: the one holding the node's `now`.
    pub(crate) last: u64,
    /// Every pool that ended a dispatch in the window.
    pub(crate) pools: Vec<RecordedPool>,
}

/// Where an [`Instant`] falls on the wall clock: intervals are counted from the Unix epoch,
/// so two nodes' intervals begin together (to within their clocks' difference).
#[derive(Clone, Copy, Debug)]
struct Clock {
    origin: Instant,
    origin_unix_ms: u64,
}

impl Clock {
    /// The index of the wall-clock interval holding `now`.
    fn interval(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_millis();
        let unix_ms = self
            .origin_unix_ms
            .saturating_add(u64::try_from(since).unwrap_or(u64::MAX));
        unix_ms / BUCKET_MS
    }
}

/// One pool's ring, shared by the history and the producers recording into it.
#[derive(Debug)]
pub(crate) struct PoolCell {
    clock: Clock,
    ring: Mutex<Ring>,
    /// Set once the history let go of the pool (evicted or forgotten): a handle holding the
    /// cell looks the pool up again rather than record where nobody reads.
    forgotten: AtomicBool,
}

impl PoolCell {
    fn new(clock: Clock) -> Self {
        Self {
            clock,
            ring: Mutex::default(),
            forgotten: AtomicBool::new(false),
        }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // The ring's operations cannot panic part-way.
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a dispatch of this pool that ended `outcome` after `latency`, at `now`.
    pub(crate) fn record(&self, outcome: &'static str, latency: Duration, now: Instant) {
        let index = self.clock.interval(now);
        let mut ring = self.ring();
        let Some(bucket) = ring.bucket(index) else {
            return;
        };
        *bucket.outcomes.entry(outcome).or_insert(0) += 1;
        bucket.latency[bin(latency)] += 1;
    }

    fn forget(&self) {
        self.forgotten.store(true, Ordering::Relaxed);
    }

    fn is_forgotten(&self) -> bool {
        self.forgotten.load(Ordering::Relaxed)
    }
}

/// The recent dispatches of every pool; see the module documentation.
#[derive(Debug)]
pub(crate) struct PoolHistory {
    clock: Clock,
    pools: HashMap<String, HashMap<String, Arc<PoolCell>>>,
    len: usize,
}

impl PoolHistory {
    /// An empty history started at `origin`, which was `origin_unix_ms` on the wall clock.
    pub(crate) fn new(origin: Instant, origin_unix_ms: u64) -> Self {
        Self {
            clock: Clock {
                origin,
                origin_unix_ms,
            },
            pools: HashMap::new(),
            len: 0,
        }
    }

    /// The cell of `(namespace, task_queue)`, made (evicting the stalest pool when
    /// [`MAX_POOLS`] are kept) if the pool is new.
    pub(crate) fn pool(&mut self, namespace: &str, task_queue: &str) -> Arc<PoolCell> {
        if let Some(cell) = self.pools.get(namespace).and_then(|q| q.get(task_queue)) {
            return Arc::clone(cell);
        }
        if self.len >= MAX_POOLS {
            self.evict_stalest();
        }
        self.len += 1;
        let cell = Arc::new(PoolCell::new(self.clock));
        self.pools
            .entry(namespace.to_owned())
            .or_default()
            .insert(task_queue.to_owned(), Arc::clone(&cell));
        cell
    }

    /// Records a dispatch of `(namespace, task_queue)` that ended `outcome` after `latency`.
    #[cfg(test)]
    fn record(
        &mut self,
        namespace: &str,
        task_queue: &str,
        outcome: &'static str,
        latency: Duration,
        now: Instant,
    ) {
        self.pool(namespace, task_queue)
            .record(outcome, latency, now);
    }

    fn evict_stalest(&mut self) {
        let stalest = self
            .pools
            .iter()
            .flat_map(|(ns, queues)| {
                queues
                    .iter()
                    .map(move |(tq, cell)| (ns, tq, cell.ring().latest()))
            })
            .min_by_key(|(_, _, latest)| *latest)
            .map(|(ns, tq, _)| (ns.clone(), tq.clone()));
        if let Some((namespace, task_queue)) = stalest {
            self.remove(&namespace, &task_queue);
        }
    }

    fn remove(&mut self, namespace: &str, task_queue: &str) {
        if let Some(queues) = self.pools.get_mut(namespace) {
            if let Some(cell) = queues.remove(task_queue) {
                cell.forget();
                self.len -= 1;
            }
            if queues.is_empty() {
                self.pools.remove(namespace);
            }
        }
    }

    /// Every pool that ended a dispatch within the window ending `now`, ordered by namespace
    /// and task queue; pools silent for the whole window are forgotten.
    pub(crate) fn snapshot(&mut self, now: Instant) -> Vec<PoolSeries> {
        let recorded = self.recorded(now);
        merge(recorded.first, recorded.last, [(None, recorded)])
    }

    /// Every pool's counts and bins within the window ending `now`; pools silent for the
    /// whole window are forgotten.
    pub(crate) fn recorded(&mut self, now: Instant) -> Recorded {
        let last = self.clock.interval(now);
        let start = self.clock.interval(self.clock.origin);
        let first = last.saturating_sub(BUCKETS as u64 - 1).max(start);
        let mut silent = Vec::new();
        let mut pools = Vec::new();
        for (namespace, queues) in &mut self.pools {
            for (task_queue, cell) in queues.iter() {
                let mut ring = cell.ring();
                ring.expire(last);
                if ring.buckets.is_empty() {
                    silent.push((namespace.clone(), task_queue.clone()));
                    continue;
                }
                pools.push(RecordedPool {
                    namespace: namespace.clone(),
                    task_queue: task_queue.clone(),
                    buckets: ring.buckets.iter().map(Bucket::recorded).collect(),
                });
            }
        }
        for (namespace, task_queue) in silent {
            self.remove(&namespace, &task_queue);
        }
        Recorded { first, last, pools }
    }
}

/// One interval of one pool summed over nodes.
struct Sum {
    outcomes: BTreeMap<String, u64>,
    latency: Box<[u64; BINS]>,
}

/// The pools of every `(node, recorded)` part as the console draws them over the intervals
/// `first..=last`: a pool's intervals are summed over the parts that hold it (outcome counts
/// and latency bins), its percentiles read from the summed bins. A part's intervals outside
/// the window, and latency bins no ring has, are left out. With a node named, each pool lists
/// the nodes it came from (`gateway_nodes`).
pub(crate) fn merge(
    first: u64,
    last: u64,
    parts: impl IntoIterator<Item = (Option<String>, Recorded)>,
) -> Vec<PoolSeries> {
    type Pool = (Vec<String>, BTreeMap<u64, Sum>);
    let mut pools: BTreeMap<(String, String), Pool> = BTreeMap::new();
    let mut named = false;
    for (node, recorded) in parts {
        named |= node.is_some();
        for pool in recorded.pools {
            let (nodes, sums) = pools
                .entry((pool.namespace, pool.task_queue))
                .or_insert_with(|| (Vec::new(), BTreeMap::new()));
            if let Some(node) = &node
                && !nodes.contains(node)
            {
                nodes.push(node.clone());
            }
            for bucket in pool.buckets {
                if bucket.index < first || bucket.index > last {
                    continue;
                }
                let sum = sums.entry(bucket.index).or_insert_with(|| Sum {
                    outcomes: BTreeMap::new(),
                    latency: Box::new([0; BINS]),
                });
                for (label, n) in bucket.outcomes {
                    let count = sum.outcomes.entry(label).or_insert(0);
                    *count = count.saturating_add(n);
                }
                for (bin, n) in bucket.latency {
                    if let Some(count) = sum.latency.get_mut(bin) {
                        *count = count.saturating_add(n);
                    }
                }
            }
        }
    }
    let width =
        usize::try_from(last.saturating_sub(first)).map_or(BUCKETS, |w| (w + 1).min(BUCKETS));
    pools
        .into_iter()
        .filter(|(_, (_, sums))| !sums.is_empty())
        .map(|((namespace, task_queue), (mut nodes, sums))| {
            let mut points = vec![Point::default(); width];
            for (index, sum) in sums {
                let slot = usize::try_from(index - first).unwrap_or(usize::MAX);
                if let Some(point) = points.get_mut(slot) {
                    *point = Point {
                        dispatches: saturating_sum(sum.outcomes.values().copied()),
                        p50_ms: quantile_ms(&sum.latency, 0.5),
                        p99_ms: quantile_ms(&sum.latency, 0.99),
                        outcomes: sum.outcomes,
                    };
                }
            }
            nodes.sort();
            PoolSeries {
                namespace,
                task_queue,
                points,
                gateway_nodes: named.then_some(nodes),
            }
        })
        .collect()
}

static HISTORY: OnceLock<Mutex<PoolHistory>> = OnceLock::new();

fn global() -> &'static Mutex<PoolHistory> {
    HISTORY.get_or_init(|| {
        let now = std::time::SystemTime::now();
        Mutex::new(PoolHistory::new(Instant::now(), crate::api::unix_ms(now)))
    })
}

/// The cell of `(namespace, task_queue)` in the process-wide history.
pub(crate) fn pool(namespace: &str, task_queue: &str) -> Arc<PoolCell> {
    global()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pool(namespace, task_queue)
}

/// A producer's cells of the process-wide history: the last pool it dispatched to, looked up
/// again only when the pool changes or the history let go of it.
#[derive(Debug, Default)]
pub(crate) struct PoolHandles {
    last: Option<(String, String, Arc<PoolCell>)>,
}

impl PoolHandles {
    /// The cell of `(namespace, task_queue)`.
    pub(crate) fn get(&mut self, namespace: &str, task_queue: &str) -> Arc<PoolCell> {
        self.get_in(namespace, task_queue, pool)
    }

    fn get_in(
        &mut self,
        namespace: &str,
        task_queue: &str,
        lookup: impl FnOnce(&str, &str) -> Arc<PoolCell>,
    ) -> Arc<PoolCell> {
        if let Some((ns, tq, cell)) = &self.last {
            if ns == namespace && tq == task_queue && !cell.is_forgotten() {
                return Arc::clone(cell);
            }
        }
        let cell = lookup(namespace, task_queue);
        self.last = Some((
            namespace.to_owned(),
            task_queue.to_owned(),
            Arc::clone(&cell),
        ));
        cell
    }
}

/// The process-wide history now.
pub(crate) fn snapshot() -> Vec<PoolSeries> {
    let now = Instant::now();
    global()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .snapshot(now)
}

/// The process-wide history now, as counts and bins for another node to merge.
pub(crate) fn recorded() -> Recorded {
    let now = Instant::now();
    global()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .recorded(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    /// A wall-clock start on an interval boundary.
    const WALL: u64 = 1_700_000_000_000;

    #[test]
    fn outcomes_and_percentiles_land_in_their_interval() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        for _ in 0..98 {
            history.record("billing", "default", "completed", 2 * MS, origin);
        }
        history.record("billing", "default", "failed", 2 * MS, origin);
        history.record("billing", "default", "timed_out", 900 * MS, origin);
        // The next interval: one dispatch.
        let later = origin + BUCKET;
        history.record("billing", "default", "completed", 40 * MS, later);

        let series = history.snapshot(later);
        assert_eq!(series.len(), 1);
        let points = &series[0].points;
        assert_eq!(points.len(), 2, "the window starts at the origin");
        let first = &points[0];
        assert_eq!(first.dispatches, 100);
        assert_eq!(first.outcomes.get("completed"), Some(&98));
        assert_eq!(first.outcomes.get("failed"), Some(&1));
        let p50 = first.p50_ms.unwrap();
        assert!((2.0..2.4).contains(&p50), "p50 {p50}");
        // The 99th of 100 still took 2 ms: one slow outlier in a hundred is above the p99.
        let p99 = first.p99_ms.unwrap();
        assert!((2.0..2.4).contains(&p99), "p99 {p99}");
        assert_eq!(points[1].dispatches, 1);
        let p99_later = points[1].p99_ms.unwrap();
        assert!((40.0..48.0).contains(&p99_later), "p99 {p99_later}");
    }

    /// `docs/operations.md`: an interval in which no dispatch ended has no latencies (`null`).
    #[test]
    fn an_interval_without_dispatches_has_no_latencies() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        history.record("billing", "default", "completed", 2 * MS, origin);
        let series = history.snapshot(origin + 2 * BUCKET);
        let points = &series[0].points;
        assert_eq!(points.len(), 3);
        for quiet in &points[1..] {
            assert_eq!(quiet.dispatches, 0);
            assert_eq!((quiet.p50_ms, quiet.p99_ms), (None, None));
        }
        let json = serde_json::to_value(&points[1]).unwrap();
        assert!(
            json["p50_ms"].is_null() && json["p99_ms"].is_null(),
            "{json}"
        );
        // Control: the interval with a dispatch has both.
        assert!(points[0].p50_ms.is_some() && points[0].p99_ms.is_some());
    }

    #[test]
    fn the_slowest_percent_sets_the_p99() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        for _ in 0..95 {
            history.record("a", "q", "completed", MS, origin);
        }
        for _ in 0..5 {
            history.record("a", "q", "completed", 500 * MS, origin);
        }
        let point = &history.snapshot(origin)[0].points[0];
        let p99 = point.p99_ms.unwrap();
        assert!((500.0..600.0).contains(&p99), "p99 {p99}");
        // Control: the median stays with the fast ones.
        assert!(point.p50_ms.unwrap() < 1.2);
    }

    #[test]
    fn the_window_is_bounded_and_silent_pools_are_forgotten() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        history.record("a", "q", "completed", MS, origin);
        let end = origin + BUCKET * (BUCKETS as u32 - 1);
        history.record("a", "q", "completed", MS, end);
        let series = history.snapshot(end);
        assert_eq!(series[0].points.len(), BUCKETS);
        assert_eq!(
            series[0].points[0].dispatches, 1,
            "the origin is still in the window"
        );

        // One interval on, the origin's bucket has left the window.
        let next = end + BUCKET;
        let series = history.snapshot(next);
        assert_eq!(series[0].points.len(), BUCKETS);
        let total: u64 = series[0].points.iter().map(|p| p.dispatches).sum();
        assert_eq!(total, 1);

        // A whole window of silence forgets the pool.
        let silent = next + BUCKET * BUCKETS as u32;
        assert!(history.snapshot(silent).is_empty());
        assert!(history.pools.is_empty());
    }

    #[test]
    fn at_most_max_pools_are_kept_and_the_stalest_gives_way() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        for i in 0..MAX_POOLS {
            history.record(&format!("ns-{i}"), "q", "completed", MS, origin);
        }
        // ns-0 stays fresh; every other pool was last heard at the origin.
        let later = origin + BUCKET;
        history.record("ns-0", "q", "completed", MS, later);
        history.record("newcomer", "q", "completed", MS, later);
        let series = history.snapshot(later);
        assert_eq!(series.len(), MAX_POOLS);
        let named = |ns: &str| series.iter().any(|s| s.namespace == ns);
        assert!(named("newcomer") && named("ns-0"));
        // Control: exactly one stale pool gave way.
        let stale_left = (1..MAX_POOLS).filter(|i| named(&format!("ns-{i}"))).count();
        assert_eq!(stale_left, MAX_POOLS - 2);
    }

    #[test]
    fn a_handle_records_into_its_pool_and_looks_it_up_again_once_forgotten() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        let mut handles = PoolHandles::default();
        let mut lookups = 0;
        let mut get = |history: &mut PoolHistory, ns: &str| {
            handles.get_in(ns, "q", |ns, tq| {
                lookups += 1;
                history.pool(ns, tq)
            })
        };
        get(&mut history, "a").record("completed", MS, origin);
        get(&mut history, "a").record("failed", MS, origin);
        get(&mut history, "b").record("completed", MS, origin);
        let series = history.snapshot(origin);
        // A pool's dispatches and failures over the whole window.
        let point = |series: &[PoolSeries], ns: &str| {
            series.iter().find(|s| s.namespace == ns).map(|s| {
                let failed = s.points.iter().filter_map(|p| p.outcomes.get("failed"));
                let dispatches = s.points.iter().map(|p| p.dispatches).sum::<u64>();
                (dispatches, failed.sum::<u64>())
            })
        };
        assert_eq!(point(&series, "a"), Some((2, 1)));
        assert_eq!(point(&series, "b"), Some((1, 0)));

        // A whole window of silence forgets both pools; the handle's cell of `b` with them.
        let silent = origin + BUCKET * BUCKETS as u32;
        assert!(history.snapshot(silent).is_empty());
        get(&mut history, "b").record("completed", MS, silent);
        let series = history.snapshot(silent);
        assert_eq!(
            point(&series, "b"),
            Some((1, 0)),
            "recorded where the history reads, not into the forgotten cell"
        );
        // Control: the same pool twice in a row was looked up once.
        assert_eq!(lookups, 3, "a, b, then b again after it was forgotten");
    }

    #[test]
    fn latency_bins_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for micros in [1u64, 2, 3, 10, 999, 1_000, 1_001, 65_000, 10_000_000] {
            let latency = Duration::from_micros(micros);
            let b = bin(latency);
            assert!(b >= last, "{micros} µs went to bin {b} after {last}");
            assert!(
                bin_upper_micros(b) >= micros as f64,
                "{micros} µs above bin {b}"
            );
            last = b;
        }
        assert_eq!(bin(Duration::from_secs(100_000)), BINS - 1);
    }

    #[test]
    fn counts_another_node_sends_near_the_limit_saturate_instead_of_overflowing() {
        let part = |outcomes: &[(&str, u64)], latency: Vec<(usize, u64)>| Recorded {
            first: 7,
            last: 7,
            pools: vec![RecordedPool {
                namespace: "n".to_owned(),
                task_queue: "q".to_owned(),
                buckets: vec![RecordedBucket {
                    index: 7,
                    outcomes: outcomes
                        .iter()
                        .map(|(l, n)| ((*l).to_owned(), *n))
                        .collect(),
                    latency,
                }],
            }],
        };
        let huge = part(
            &[("completed", u64::MAX), ("failed", 1)],
            vec![(0, u64::MAX), (3, 5)],
        );
        let merged = merge(7, 7, [(Some("b".to_owned()), huge)]);
        let point = &merged[0].points[0];
        assert_eq!(point.dispatches, u64::MAX);
        assert!(point.p50_ms.is_some() && point.p99_ms.is_some());
        // Control: ordinary counts are summed exactly.
        let plain = part(&[("completed", 3), ("failed", 1)], vec![(0, 4)]);
        let merged = merge(7, 7, [(Some("b".to_owned()), plain)]);
        assert_eq!(merged[0].points[0].dispatches, 4);
    }

    /// The bytes of the answer a node sends another (its `recorded` history as JSON) when
    /// `pools` pools (namespaces of 13 characters, task queue `default`) each ended
    /// dispatches in 10 latency bins in every interval of the window.
    fn answer_bytes(pools: usize) -> usize {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin, WALL);
        for interval in 0..BUCKETS as u32 {
            let at = origin + BUCKET * interval;
            for pool in 0..pools {
                let namespace = format!("namespace-{pool:03}");
                for doubling in 0..10 {
                    history.record(&namespace, "default", "completed", MS * (1 << doubling), at);
                }
            }
        }
        let recorded = history.recorded(origin + BUCKET * (BUCKETS as u32 - 1));
        assert_eq!(recorded.pools.len(), pools);
        let json = serde_json::to_value(recorded).unwrap();
        serde_json::to_vec(&json).unwrap().len()
    }

    #[test]
    fn a_nodes_answer_takes_about_130_bytes_per_pool_and_interval_so_a_mib_holds_about_130_busy_pools()
     {
        const MIB: usize = 1 << 20;
        let all = answer_bytes(MAX_POOLS);
        let per_cell = all / (MAX_POOLS * BUCKETS);
        assert!(
            (120..=140).contains(&per_cell),
            "{per_cell} bytes ({all} in all)"
        );
        assert!((1_900_000..2_100_000).contains(&all), "{all}");
        // NATS's default max_payload: 130 pools busy through the window fit, 140 do not.
        assert!(answer_bytes(130) < MIB);
        assert!(answer_bytes(140) > MIB);
    }

    /// `docs/operations.md`: 10 s intervals, 60 of them per pool, at most 256 pools.
    #[test]
    fn the_ring_is_the_documented_size() {
        assert_eq!(BUCKET, Duration::from_secs(10));
        assert_eq!(BUCKETS, 60);
        assert_eq!(MAX_POOLS, 256);
    }
}
