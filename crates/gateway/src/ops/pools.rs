//! Per-pool figures computed from core on demand, for `/metrics` and `/v1/pools`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use switchyard_core::Core;

/// What one `(namespace, task queue)` pool holds and waits for right now.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct PoolStats {
    /// Namespace.
    pub(crate) namespace: String,
    /// Task queue.
    pub(crate) task_queue: String,
    /// Registered workers.
    pub(crate) workers: u64,
    /// Sum of announced capacities (workers that have not announced count 0).
    pub(crate) capacity: u64,
    /// Tasks held by its workers.
    pub(crate) in_flight: u64,
    /// Activity types its workers run.
    pub(crate) activity_types: Vec<String>,
    /// Dispatches parked waiting for a worker of the pool.
    pub(crate) parked: u64,
    /// How long the oldest of them has waited, in seconds.
    pub(crate) oldest_parked_seconds: f64,
}

/// Every pool with a worker or a parked dispatch, ordered by namespace and task queue.
pub(crate) fn pool_stats(core: &Core) -> Vec<PoolStats> {
    let mut pools: BTreeMap<(String, String), PoolStats> = BTreeMap::new();
    for snapshot in core.registry().workers() {
        let worker = &snapshot.worker;
        for namespace in worker.namespaces() {
            let key = (namespace.clone(), worker.task_queue().to_owned());
            let pool = pools.entry(key).or_insert_with(|| PoolStats {
                namespace: namespace.clone(),
                task_queue: worker.task_queue().to_owned(),
                ..PoolStats::default()
            });
            pool.workers += 1;
            pool.capacity += u64::from(snapshot.capacity.unwrap_or(0));
            pool.in_flight += u64::from(snapshot.in_flight);
            for activity in worker.activity_types() {
                if !pool.activity_types.contains(activity) {
                    pool.activity_types.push(activity.clone());
                }
            }
        }
    }
    for queue in core.dispatcher().unserved_queues() {
        let address = &queue.address;
        let key = (address.namespace.clone(), address.task_queue.clone());
        let pool = pools.entry(key).or_insert_with(|| PoolStats {
            namespace: address.namespace.clone(),
            task_queue: address.task_queue.clone(),
            ..PoolStats::default()
        });
        pool.parked += queue.waiting as u64;
        pool.oldest_parked_seconds = pool
            .oldest_parked_seconds
            .max(queue.oldest_wait.as_secs_f64());
    }
    let mut list: Vec<PoolStats> = pools.into_values().collect();
    for pool in &mut list {
        pool.activity_types.sort();
    }
    list
}

/// Parked dispatches summed by unserved reason.
pub(crate) fn parked_by_reason(core: &Core) -> BTreeMap<&'static str, u64> {
    let mut by_reason = BTreeMap::new();
    for queue in core.dispatcher().unserved_queues() {
        *by_reason.entry(queue.reason.as_str()).or_insert(0) += queue.waiting as u64;
    }
    by_reason
}

/// Seconds as a float for JSON.
pub(crate) fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
