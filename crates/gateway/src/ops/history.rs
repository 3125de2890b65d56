//! [`PoolHistory`]: the console's recent past of each `(namespace, task queue)` pool: how many
//! dispatches ended per interval, with which outcomes, and their p50 / p99 latency.
//!
//! A bounded in-memory ring, no external database: [`BUCKETS`] intervals of [`BUCKET`] per
//! pool, at most [`MAX_POOLS`] pools (the one heard from least recently gives way). Latency is
//! kept in log-spaced bins ([`BINS_PER_OCTAVE`] per doubling, so a percentile is within about
//! 19 % of the true value) rather than as samples, so a busy pool costs the same memory as an
//! idle one.
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

use serde::Serialize;
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

    /// The upper bound of the bin holding the `q` quantile, in milliseconds.
    fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency.iter().map(|&n| u64::from(n)).sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (bin, &count) in self.latency.iter().enumerate() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(bin_upper_micros(bin) / 1000.0);
            }
        }
        None
    }
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
    pub(crate) outcomes: BTreeMap<&'static str, u64>,
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
}

/// The index of the interval holding `now`, for intervals counted from `origin`.
fn interval(origin: Instant, now: Instant) -> u64 {
    (now.saturating_duration_since(origin).as_nanos() / BUCKET.as_nanos()) as u64
}

/// One pool's ring, shared by the history and the producers recording into it.
#[derive(Debug)]
pub(crate) struct PoolCell {
    origin: Instant,
    ring: Mutex<Ring>,
    /// Set once the history let go of the pool (evicted or forgotten): a handle holding the
    /// cell looks the pool up again rather than record where nobody reads.
    forgotten: AtomicBool,
}

impl PoolCell {
    fn new(origin: Instant) -> Self {
        Self {
            origin,
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
        let index = interval(self.origin, now);
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
    origin: Instant,
    pools: HashMap<String, HashMap<String, Arc<PoolCell>>>,
    len: usize,
}

impl PoolHistory {
    /// An empty history whose intervals count from `origin`.
    pub(crate) fn new(origin: Instant) -> Self {
        Self {
            origin,
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
        let cell = Arc::new(PoolCell::new(self.origin));
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
        let index = interval(self.origin, now);
        let first = index.saturating_sub(BUCKETS as u64 - 1);
        let mut silent = Vec::new();
        let mut series = Vec::new();
        for (namespace, queues) in &mut self.pools {
            for (task_queue, cell) in queues.iter() {
                let mut ring = cell.ring();
                ring.expire(index);
                if ring.buckets.is_empty() {
                    silent.push((namespace.clone(), task_queue.clone()));
                    continue;
                }
                let mut points = vec![Point::default(); (index - first + 1) as usize];
                for bucket in &ring.buckets {
                    let Some(slot) = bucket.index.checked_sub(first) else {
                        continue;
                    };
                    if let Some(point) = points.get_mut(slot as usize) {
                        *point = Point {
                            dispatches: bucket.outcomes.values().sum(),
                            outcomes: bucket.outcomes.clone(),
                            p50_ms: bucket.quantile_ms(0.5),
                            p99_ms: bucket.quantile_ms(0.99),
                        };
                    }
                }
                series.push(PoolSeries {
                    namespace: namespace.clone(),
                    task_queue: task_queue.clone(),
                    points,
                });
            }
        }
        for (namespace, task_queue) in silent {
            self.remove(&namespace, &task_queue);
        }
        series.sort_by(|a, b| (&a.namespace, &a.task_queue).cmp(&(&b.namespace, &b.task_queue)));
        series
    }
}

static HISTORY: OnceLock<Mutex<PoolHistory>> = OnceLock::new();

fn global() -> &'static Mutex<PoolHistory> {
    HISTORY.get_or_init(|| Mutex::new(PoolHistory::new(Instant::now())))
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn outcomes_and_percentiles_land_in_their_interval() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin);
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

    #[test]
    fn the_slowest_percent_sets_the_p99() {
        let origin = Instant::now();
        let mut history = PoolHistory::new(origin);
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
        let mut history = PoolHistory::new(origin);
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
        let mut history = PoolHistory::new(origin);
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
        let mut history = PoolHistory::new(origin);
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
}
