//! Counting a pool's workers by standing, and turning the count into an operator's answer.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::Registry;
use crate::address::normalise_task_queue;
use crate::eligibility::Eligibility;

/// How the workers of a pool stand for one `(activity type, node)` dispatch.
///
/// `compatible` workers serve the activity on a matching node; the standing counts below it
/// partition them (each worker is counted once, by the first reason in [`Eligibility`]'s
/// precedence).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolCensus {
    /// Workers registered in the `(namespace, task queue)` pool, whatever they run.
    pub pool_workers: usize,
    /// Of those, workers serving the activity type (any node).
    pub activity_workers: usize,
    /// Of those, workers on a matching node.
    pub compatible: usize,
    /// Compatible workers whose every slot is taken.
    pub at_capacity: usize,
    /// Compatible workers that have not announced capacity.
    pub capacity_unannounced: usize,
    /// Compatible workers that announced capacity their connection cannot carry yet.
    pub awaiting_streams: usize,
    /// Compatible workers on opening probation.
    pub on_probation: usize,
    /// Compatible workers the liveness probe lost.
    pub reachability_lost: usize,
    /// Compatible workers being drained.
    pub draining: usize,
    /// Compatible workers whose connection is gone but who have not left yet.
    pub disconnected: usize,
    /// Compatible workers that may take the dispatch now.
    pub eligible: usize,
    /// How long ago the last compatible worker left, while none is registered; `None` if one
    /// is registered or none ever was (within the registry's memory).
    pub last_compatible_departure: Option<Duration>,
    /// Compatible workers with at least one reclaimed task (an ended task they neither
    /// answered nor acknowledged in time); also counted by their standing above.
    pub unresponsive: usize,
    /// Compatible workers whose connection was lost and whose session waits for a resume.
    pub suspended: usize,
    /// The longest time a suspended compatible worker has left to resume.
    pub suspended_grace_left: Option<Duration>,
}

/// Why a dispatch finds no worker: the classification of a census with nobody eligible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnservedReason {
    /// No worker is registered in the pool at all.
    NoWorkers,
    /// The pool has workers, but none runs this activity type on a matching node.
    WorkersIncompatible,
    /// Every compatible worker is at capacity.
    AllAtCapacity,
    /// Compatible workers exist but have not announced their capacity.
    CapacityUnannounced,
    /// Compatible workers announced capacity their connection cannot carry yet.
    AwaitingStreams,
    /// Every compatible worker is unreachable by the liveness probe.
    WorkersUnreachable,
    /// Compatible workers are on opening probation; this clears by itself within seconds.
    OnProbation,
    /// Every compatible worker is draining.
    Draining,
    /// Compatible workers lost their connection and their sessions wait for them to resume;
    /// clears by itself when they resume or their grace ends.
    WorkersSuspended,
    /// No local worker can take it and no other gateway node of the cluster took the offer.
    NoCapacityInCluster,
}

impl UnservedReason {
    /// A stable lowercase label for metrics and the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoWorkers => "no_workers",
            Self::WorkersIncompatible => "workers_incompatible",
            Self::AllAtCapacity => "all_at_capacity",
            Self::CapacityUnannounced => "capacity_unannounced",
            Self::AwaitingStreams => "awaiting_streams",
            Self::WorkersUnreachable => "workers_unreachable",
            Self::OnProbation => "on_probation",
            Self::Draining => "draining",
            Self::WorkersSuspended => "workers_suspended",
            Self::NoCapacityInCluster => "no_capacity_in_cluster",
        }
    }

    /// Every reason, in declaration order.
    pub const ALL: [UnservedReason; 10] = [
        UnservedReason::NoWorkers,
        UnservedReason::WorkersIncompatible,
        UnservedReason::AllAtCapacity,
        UnservedReason::CapacityUnannounced,
        UnservedReason::AwaitingStreams,
        UnservedReason::WorkersUnreachable,
        UnservedReason::OnProbation,
        UnservedReason::Draining,
        UnservedReason::WorkersSuspended,
        UnservedReason::NoCapacityInCluster,
    ];

    /// The reason with this [`as_str`](Self::as_str) label, if any.
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == label)
    }

    /// True when the condition clears by itself (probation, a suspension that resumes or
    /// expires within its grace), so parking is the ordinary cost.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::OnProbation | Self::WorkersSuspended)
    }
}

impl fmt::Display for UnservedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PoolCensus {
    /// `None` when a worker is eligible; otherwise the one reason the dispatch waits.
    pub fn classify(&self) -> Option<UnservedReason> {
        if self.eligible > 0 {
            return None;
        }
        Some(if self.pool_workers == 0 {
            UnservedReason::NoWorkers
        } else if self.compatible == 0 {
            UnservedReason::WorkersIncompatible
        } else if self.reachability_lost == self.compatible {
            UnservedReason::WorkersUnreachable
        } else if self.at_capacity > 0 {
            UnservedReason::AllAtCapacity
        } else if self.on_probation > 0 {
            UnservedReason::OnProbation
        } else if self.suspended > 0 {
            UnservedReason::WorkersSuspended
        } else if self.awaiting_streams > 0 {
            UnservedReason::AwaitingStreams
        } else if self.capacity_unannounced > 0 {
            UnservedReason::CapacityUnannounced
        } else if self.reachability_lost > 0 {
            UnservedReason::WorkersUnreachable
        } else if self.draining > 0 {
            UnservedReason::Draining
        } else {
            UnservedReason::NoWorkers
        })
    }

    /// An operator's sentence: the reason and the numbers behind it; `None` when served.
    pub fn describe(&self) -> Option<String> {
        let reason = self.classify()?;
        let age = match self.last_compatible_departure {
            Some(age) => format!("; the last compatible worker left {}s ago", age.as_secs()),
            None if self.compatible == 0 => "; no compatible worker has been seen".to_owned(),
            None => String::new(),
        };
        let text = match reason {
            UnservedReason::NoWorkers => "no worker is registered in this pool".to_owned(),
            UnservedReason::WorkersIncompatible => format!(
                "{} worker(s) in the pool, {} serve this activity type, none on a matching node or \
                 activity",
                self.pool_workers, self.activity_workers
            ),
            UnservedReason::AllAtCapacity => {
                format!(
                    "all {} compatible worker(s) are at capacity",
                    self.at_capacity
                )
            }
            UnservedReason::CapacityUnannounced => format!(
                "{} compatible worker(s) have not announced their capacity",
                self.capacity_unannounced
            ),
            UnservedReason::AwaitingStreams => format!(
                "{} compatible worker(s) announced their capacity but their connection cannot \
                 carry tasks yet (no stream credit granted)",
                self.awaiting_streams
            ),
            UnservedReason::WorkersUnreachable => format!(
                "{} compatible worker(s) are unreachable by the liveness probe",
                self.reachability_lost
            ),
            UnservedReason::OnProbation => format!(
                "{} compatible worker(s) are on opening probation (clears within seconds)",
                self.on_probation
            ),
            UnservedReason::Draining => {
                format!("{} compatible worker(s) are draining", self.draining)
            }
            UnservedReason::WorkersSuspended => format!(
                "{} compatible worker(s) lost their connection and may resume within {}s (their \
                 tasks wait for them)",
                self.suspended,
                self.suspended_grace_left.unwrap_or_default().as_secs()
            ),
            // A census counts local workers only; it never classifies as this.
            UnservedReason::NoCapacityInCluster => "no capacity in cluster".to_owned(),
        };
        Some(format!("{reason}: {text}{age}"))
    }
}

impl Registry {
    /// Whether the pool has any compatible worker (on `node` when given), whatever its
    /// standing: [`PoolCensus::compatible`] above zero, without counting the rest.
    pub fn has_compatible_workers(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> bool {
        let task_queue = normalise_task_queue(task_queue);
        let state = self.inner.lock();
        state
            .rotation(namespace, task_queue, activity_type)
            .is_some_and(|rotation| {
                rotation
                    .members
                    .values()
                    .filter_map(|slot| state.workers.at(*slot))
                    .any(|entry| node_matches(entry, node))
            })
    }

    /// Counts the pool's workers by standing for a dispatch of `activity_type` (on `node`).
    pub fn pool_census(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> PoolCensus {
        let task_queue = normalise_task_queue(task_queue);
        let now = Instant::now();
        let state = self.inner.lock();
        let mut census = PoolCensus {
            pool_workers: state
                .queue(namespace, task_queue)
                .map_or(0, |queue| queue.workers),
            ..PoolCensus::default()
        };
        if let Some(rotation) = state.rotation(namespace, task_queue, activity_type) {
            for entry in rotation
                .members
                .values()
                .filter_map(|slot| state.workers.at(*slot))
            {
                census.activity_workers += 1;
                if !node_matches(entry, node) {
                    continue;
                }
                census.compatible += 1;
                if entry.unresponsive > 0 {
                    census.unresponsive += 1;
                }
                match state.standing(entry) {
                    Eligibility::Eligible => census.eligible += 1,
                    Eligibility::AtCapacity { .. } => census.at_capacity += 1,
                    Eligibility::CapacityUnannounced => census.capacity_unannounced += 1,
                    Eligibility::AwaitingStreams { .. } => census.awaiting_streams += 1,
                    Eligibility::OnProbation => census.on_probation += 1,
                    Eligibility::Unreachable => census.reachability_lost += 1,
                    Eligibility::Draining => census.draining += 1,
                    Eligibility::Suspended => {
                        census.suspended += 1;
                        let left = entry
                            .session
                            .as_ref()
                            .and_then(|session| session.suspended_until)
                            .map(|until| until.saturating_duration_since(now));
                        census.suspended_grace_left = census.suspended_grace_left.max(left);
                    }
                    _ => census.disconnected += 1,
                }
            }
        }
        if census.compatible == 0 {
            let key = crate::ActivityKey::new(namespace, task_queue, activity_type);
            census.last_compatible_departure = state
                .departures
                .get(&key)
                .and_then(|nodes| {
                    nodes
                        .iter()
                        .filter(|(n, _)| node.is_none() || n.as_ref().map(|n| n.as_str()) == node)
                        .map(|(_, at)| *at)
                        .max()
                })
                .map(|at| now.saturating_duration_since(at));
        }
        census
    }
}

/// Whether `entry` runs on `node` (any worker matches when no node is asked for): one rule for
/// the census and [`Registry::has_compatible_workers`].
fn node_matches(entry: &super::workers::WorkerEntry, node: Option<&str>) -> bool {
    node.is_none_or(|n| entry.worker.node().map(|w| w.as_str()) == Some(n))
}
