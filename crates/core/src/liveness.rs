//! Liveness: pings every worker on its task path and publishes who may be dispatched to.
//!
//! [`LivenessTracker`] holds the decisions as plain data driven by `now`; [`Liveness`] is the
//! thin async driver that sends pings through each worker's delivery, feeds answers back in,
//! publishes the whole exclusion map and deregisters silent workers.

mod config;
#[cfg(test)]
mod tests;
mod tracker;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

pub use config::LivenessConfig;
pub use tracker::{LivenessTracker, TickActions};

use crate::address::WorkerId;
use crate::delivery::WorkerMessage;
use crate::eligibility::DispatchExclusion;
use crate::events::{DisconnectReason, WorkerEvent};
use crate::registry::Registry;

/// The least time between two rounds run for pings falling due: a ping goes out at most this
/// late, on a schedule that stays anchored to whole intervals.
const MIN_ROUND_GAP: std::time::Duration = std::time::Duration::from_millis(5);

/// Handle on the liveness prober; transports report pongs and frames here.
#[derive(Clone)]
pub struct Liveness {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    config: LivenessConfig,
    tracker: Mutex<LivenessTracker>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Liveness {
    /// A prober for `registry`, not yet running (see [`Liveness::spawn`]).
    pub fn new(registry: Registry, config: LivenessConfig) -> Self {
        let tracker = Mutex::new(LivenessTracker::new(config.clone()));
        Self {
            inner: Arc::new(Inner {
                registry,
                config,
                tracker,
            }),
        }
    }

    /// The configuration in force (transports tell workers the ping interval).
    pub fn config(&self) -> &LivenessConfig {
        &self.inner.config
    }

    fn tracker(&self) -> MutexGuard<'_, LivenessTracker> {
        self.inner
            .tracker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Any frame arrived from `worker`.
    pub fn record_frame(&self, worker: WorkerId) {
        self.tracker().record_frame(worker, Instant::now());
    }

    /// `worker` answered ping `seq`; lifting probation or completing recovery is published at
    /// once, so a new worker on loopback is eligible within a round trip or two.
    pub fn record_pong(&self, worker: WorkerId, seq: u64) {
        let (before, changed) = {
            let mut tracker = self.tracker();
            let before = tracker.exclusion(worker);
            (before, tracker.record_pong(worker, seq, Instant::now()))
        };
        if !changed {
            return;
        }
        match before {
            Some(DispatchExclusion::ReachabilityLost) => {
                tracing::info!(worker = %worker, "worker reachable again after a full probation");
            }
            _ => tracing::debug!(worker = %worker, "opening probation passed"),
        }
        self.publish();
    }

    /// Publishes the whole exclusion map. Workers admitted after the newest one the tracker
    /// knows keep their opening probation; with an empty tracker that is every worker (ids
    /// start at 1), never "no bound", which would clear the probation of workers whose
    /// `Connected` event the prober has not read yet.
    fn publish(&self) {
        let (exclusions, newest) = {
            let tracker = self.tracker();
            (tracker.exclusions(), tracker.newest())
        };
        let newest = newest.unwrap_or(WorkerId::from_raw(0));
        self.inner
            .registry
            .publish_verdicts(exclusions, Some(newest));
    }

    fn send_pings(&self, pings: Vec<(WorkerId, u64)>) {
        if pings.is_empty() {
            return;
        }
        // One registry lock for the round's pings; delivered after it is released.
        for (worker, seq, delivery) in self.inner.registry.deliveries_of(pings) {
            // A refused ping is simply never answered; it counts as missed when it expires.
            if let Err(error) = delivery.deliver(WorkerMessage::Ping { seq }) {
                tracing::trace!(worker = %worker, %error, "ping not delivered");
            }
        }
    }

    fn admit(&self, worker: WorkerId) {
        let pings = self.tracker().add_worker(worker, Instant::now());
        self.send_pings(pings.into_iter().map(|seq| (worker, seq)).collect());
    }

    /// Brings the tracker in line with the registry after missed events: forgets workers that
    /// left and starts probation for announced workers it never saw. Offering every registered worker is
    /// safe because [`LivenessTracker::add_worker`] ignores workers already tracked, so a
    /// proven worker keeps its standing and gets no extra pings.
    fn reconcile(&self) {
        // Only announced workers: a worker's transport announces it once it may be pinged.
        let registered: std::collections::HashSet<WorkerId> = self
            .inner
            .registry
            .inner
            .announced_workers()
            .into_iter()
            .collect();
        let gone: Vec<WorkerId> = self
            .tracker()
            .workers()
            .filter(|id| !registered.contains(id))
            .collect();
        for id in gone {
            self.tracker().remove_worker(id);
        }
        for id in registered {
            self.admit(id);
        }
    }

    fn round(&self) {
        let actions = self.tracker().tick(Instant::now());
        for worker in &actions.newly_lost {
            tracing::warn!(worker = %worker, "worker unreachable: pings on its task path unanswered");
        }
        for worker in actions.timed_out {
            tracing::warn!(worker = %worker, "worker silent for the heartbeat window; deregistering");
            self.inner
                .registry
                .deregister(worker, DisconnectReason::Timeout);
        }
        self.send_pings(actions.pings);
        self.publish();
    }

    /// Starts the prober on the current tokio runtime; it runs until the handle is aborted.
    pub fn spawn(&self) -> JoinHandle<()> {
        let liveness = self.clone();
        let mut events = self.inner.registry.subscribe_events();
        // Workers admitted before the prober started.
        liveness.reconcile();
        tokio::spawn(async move {
            let period = liveness
                .inner
                .config
                .ping_interval
                .min(liveness.inner.config.ping_timeout)
                / 2;
            let mut ticker = tokio::time::interval(period.max(std::time::Duration::from_millis(1)));
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut last_round = Instant::now();
            loop {
                // Rounds run on the ticker (expiries, verdicts) and also when a ping falls
                // due, so pings keep `ping_interval` instead of the ticker's granularity.
                // Workers registered at different moments fall due at different moments; a
                // round no sooner than MIN_ROUND_GAP after the last takes whatever fell due
                // meanwhile, so thousands of workers cost at most 200 rounds a second, not
                // one per timer tick.
                let next_ping = liveness
                    .tracker()
                    .next_ping_due()
                    .map(|at| at.max(last_round + MIN_ROUND_GAP));
                let ping_due = async move {
                    match next_ping {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    event = events.recv() => match event {
                        Ok(WorkerEvent::Connected { worker, .. }) => liveness.admit(worker),
                        // A suspended worker is not pinged (its grace decides); a resumed one
                        // starts over, proving itself on its new connection, also when it
                        // resumed over one still open: that one's silence and unanswered pings
                        // say nothing about the new one, and the resume itself is a sign of life.
                        Ok(WorkerEvent::Disconnected { worker, .. } | WorkerEvent::Suspended { worker, .. }) => {
                            liveness.tracker().remove_worker(worker);
                        }
                        Ok(WorkerEvent::Resumed { worker }) => {
                            liveness.tracker().remove_worker(worker);
                            liveness.admit(worker);
                        }
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => liveness.reconcile(),
                        Err(RecvError::Closed) => break,
                    },
                    _ = ticker.tick() => {
                        liveness.round();
                        last_round = Instant::now();
                    }
                    () = ping_due => {
                        liveness.round();
                        last_round = Instant::now();
                    }
                }
            }
        })
    }
}
