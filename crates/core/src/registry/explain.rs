//! Per-worker answers to "why is my task not placed".

use super::Registry;
use crate::address::normalise_task_queue;
use crate::eligibility::Eligibility;
use crate::worker::Worker;

/// One worker of a pool and the one reason it can or cannot take a given dispatch now.
#[derive(Clone, Debug)]
pub struct WorkerExplanation {
    /// The worker.
    pub worker: Worker,
    /// Its standing for this dispatch.
    pub eligibility: Eligibility,
}

impl Registry {
    /// Lists every worker registered in `(namespace, task_queue)` with the reason it is or is
    /// not eligible for a dispatch of `activity_type` (pinned to `node` when given), by id.
    pub fn explain(
        &self,
        namespace: &str,
        task_queue: &str,
        activity_type: &str,
        node: Option<&str>,
    ) -> Vec<WorkerExplanation> {
        let task_queue = normalise_task_queue(task_queue);
        let state = self.inner.lock();
        state
            .pool_members(namespace, task_queue)
            .into_values()
            .filter_map(|slot| state.workers.at(slot))
            .map(|entry| {
                let worker = &entry.worker;
                let eligibility = if !worker.activity_types().contains(activity_type) {
                    Eligibility::ServesOtherActivity
                } else if node.is_some_and(|n| worker.node().map(|w| w.as_str()) != Some(n)) {
                    Eligibility::OtherNode {
                        node: worker.node().cloned(),
                    }
                } else {
                    state.standing(entry)
                };
                WorkerExplanation {
                    worker: worker.clone(),
                    eligibility,
                }
            })
            .collect()
    }
}
