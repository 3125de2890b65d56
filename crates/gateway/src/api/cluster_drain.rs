//! `Drain` from any node of a cluster.
//!
//! The asking node asks every other live node to drain what the target matches there (by node
//! label: its workers with that label; by worker id: the worker with that id, if it holds
//! one), and drains its own matches. Worker ids need not be unique across nodes: every node
//! holding the id drains its worker (with cluster-unique ids that is exactly one node). Each
//! node runs its own drain, deadline included, and keeps its latest progress; the asking node
//! polls it every [`POLL_EVERY`] and streams the sum, each worker with its gateway node. A node
//! that stops answering is named in `silent_nodes` (its last progress stays in the sum); one
//! that has left the cluster counts as done, its workers having left with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message;
use switchyard_core::CallerIdentity;
use switchyard_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::cluster_views::{CallContext, ClusterViews, DRAIN_START, DRAIN_STATUS};
use super::drain::ProgressStream;
use super::service::{GatewayApi, NOTHING_TO_DRAIN};

/// How often the asking node polls the other nodes' drains.
const POLL_EVERY: Duration = Duration::from_millis(250);
/// How long one poll waits for a node.
const POLL_TIMEOUT: Duration = Duration::from_secs(1);
/// Drains asked by other nodes that one node keeps at once (running, or ended recently).
const MAX_REMOTE_DRAINS: usize = 64;
/// How long a finished remote drain's last progress is kept for its asker's last poll.
const KEEP_FINISHED: Duration = Duration::from_secs(60);

/// Drains other nodes asked this node to run, by `(asking node, drain number)`.
#[derive(Default)]
pub(super) struct RemoteDrains {
    drains: HashMap<(String, u64), (pb::DrainProgress, Option<Instant>)>,
}

impl RemoteDrains {
    fn prune(&mut self, now: Instant) {
        self.drains.retain(|_, (_, finished)| {
            finished.is_none_or(|at| now.saturating_duration_since(at) < KEEP_FINISHED)
        });
    }
}

/// Starts the drain `key` asks for here; an empty answer when nothing here matches.
pub(super) fn start_here(
    api: &GatewayApi,
    drains: &Arc<Mutex<RemoteDrains>>,
    caller: &CallerIdentity,
    request: &pb::DrainWorkersRequest,
    key: (String, u64),
) -> Result<Bytes, Status> {
    let targets = api.local_drain_targets(caller, request)?;
    if targets.is_empty() {
        return Ok(Bytes::new());
    }
    let first = pb::DrainProgress {
        workers: targets
            .iter()
            .map(|id| pb::DrainingWorker {
                worker_id: id.get(),
                ..pb::DrainingWorker::default()
            })
            .collect(),
        ..pb::DrainProgress::default()
    };
    {
        let mut table = drains.lock().unwrap_or_else(PoisonError::into_inner);
        table.prune(Instant::now());
        if table.drains.len() >= MAX_REMOTE_DRAINS {
            return Err(Status::resource_exhausted(format!(
                "{MAX_REMOTE_DRAINS} drains asked by other nodes are already kept here"
            )));
        }
        table.drains.insert(key.clone(), (first.clone(), None));
    }
    let mut progress = api.local_drain(targets, request);
    let drains = Arc::clone(drains);
    tokio::spawn(async move {
        while let Some(Ok(now)) = progress.next().await {
            let done = now.done;
            let mut table = drains.lock().unwrap_or_else(PoisonError::into_inner);
            table
                .drains
                .insert(key.clone(), (now, done.then(Instant::now)));
        }
    });
    Ok(first.encode_to_vec().into())
}

/// The latest progress of drain `key` here.
pub(super) fn status_here(
    drains: &Arc<Mutex<RemoteDrains>>,
    key: &(String, u64),
) -> Result<Bytes, String> {
    let table = drains.lock().unwrap_or_else(PoisonError::into_inner);
    table
        .drains
        .get(key)
        .map(|(progress, _)| progress.encode_to_vec().into())
        .ok_or_else(|| format!("no drain {} asked by {}", key.1, key.0))
}

/// One node's part of a drain, as last heard.
#[derive(Clone, Debug, Default)]
struct Part {
    progress: pb::DrainProgress,
    silent: Option<String>,
}

impl ClusterViews {
    /// Drains what `request` targets on every node; `local` are this node's own targets.
    pub(super) async fn drain(
        &self,
        api: &GatewayApi,
        caller: &CallerIdentity,
        request: &pb::DrainWorkersRequest,
        local: Vec<switchyard_core::WorkerId>,
    ) -> Result<ProgressStream, Status> {
        let number = drain_number();
        let context = CallContext::of(caller, number);
        let asked = self
            .ask::<pb::DrainProgress>(DRAIN_START, &context, request)
            .await;
        let mut parts: BTreeMap<String, Part> = asked
            .answers
            .into_iter()
            .filter(|(_, progress)| !progress.workers.is_empty())
            .map(|(node, progress)| {
                (
                    node,
                    Part {
                        progress,
                        silent: None,
                    },
                )
            })
            .collect();
        let silent_at_start = asked.silent;
        if local.is_empty() && parts.is_empty() {
            let mut message = NOTHING_TO_DRAIN.to_owned();
            if !silent_at_start.is_empty() {
                let names: Vec<String> = silent_at_start
                    .iter()
                    .map(|s| format!("{} ({})", s.node, s.reason))
                    .collect();
                message.push_str(&format!(
                    "; nodes that did not answer: {}",
                    names.join(", ")
                ));
            }
            return Err(Status::not_found(message));
        }
        let mut own = (!local.is_empty()).then(|| api.local_drain(local, request));
        if let Some(stream) = &mut own {
            // The local drain sends its first sample at once: start the sum from it.
            let first = match stream.next().await {
                Some(Ok(progress)) => progress,
                Some(Err(status)) => return Err(status),
                None => pb::DrainProgress::default(),
            };
            parts.insert(
                self.node().to_owned(),
                Part {
                    progress: first,
                    silent: None,
                },
            );
        }
        let (sender, receiver) = mpsc::channel(16);
        let admin = self.admin.clone();
        let me = self.node().to_owned();
        let closing = api.closing.clone();
        tokio::spawn(async move {
            let mut last: Option<pb::DrainProgress> = None;
            let mut poll = tokio::time::interval(POLL_EVERY);
            loop {
                let now = merge_progress(&parts, &silent_at_start);
                if last.as_ref() != Some(&now) {
                    let done = now.done;
                    if sender.send(Ok(now.clone())).await.is_err() || done {
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    item = next(&mut own) => match item {
                        Some(Ok(progress)) => {
                            if let Some(part) = parts.get_mut(&me) {
                                part.progress = progress;
                            }
                        }
                        Some(Err(status)) => {
                            let _ = sender.send(Err(status)).await;
                            return;
                        }
                        None => own = None,
                    },
                    _ = poll.tick() => {
                        let live = admin.others();
                        let asks = parts
                            .iter()
                            .filter(|(node, part)| **node != me && !part.progress.done)
                            .map(|(node, _)| {
                                let admin = admin.clone();
                                let context = context.clone();
                                let node = node.clone();
                                async move {
                                    let answer = admin
                                        .ask(&node, DRAIN_STATUS, &context, Bytes::new(), POLL_TIMEOUT)
                                        .await;
                                    (node, answer)
                                }
                            });
                        for (node, answer) in futures::future::join_all(asks).await {
                            let Some(part) = parts.get_mut(&node) else { continue };
                            match answer.map(pb::DrainProgress::decode) {
                                Ok(Ok(progress)) => {
                                    part.progress = progress;
                                    part.silent = None;
                                }
                                Ok(Err(error)) => part.silent = Some(format!("unreadable: {error}")),
                                Err(_) if !live.contains(&node) => {
                                    part.silent = Some("left the cluster".to_owned());
                                    part.progress.done = true;
                                }
                                Err(reason) => part.silent = Some(reason),
                            }
                        }
                    }
                    () = sender.closed() => return,
                    () = closing.cancelled() => return,
                }
            }
        });
        Ok(ReceiverStream::new(receiver))
    }
}

async fn next(stream: &mut Option<ProgressStream>) -> Option<Result<pb::DrainProgress, Status>> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The sum of every node's part: done once every part is done.
fn merge_progress(
    parts: &BTreeMap<String, Part>,
    silent_at_start: &[pb::SilentNode],
) -> pb::DrainProgress {
    let mut merged = pb::DrainProgress {
        done: true,
        silent_nodes: silent_at_start.to_vec(),
        ..pb::DrainProgress::default()
    };
    for (node, part) in parts {
        let p = &part.progress;
        merged
            .workers
            .extend(p.workers.iter().map(|w| pb::DrainingWorker {
                gateway_node: node.clone(),
                ..w.clone()
            }));
        merged.tasks_remaining += p.tasks_remaining;
        merged.workers_left += p.workers_left;
        merged.cancelled_at_deadline += p.cancelled_at_deadline;
        merged.done &= p.done;
        if let Some(reason) = &part.silent {
            merged.silent_nodes.push(pb::SilentNode {
                node: node.clone(),
                reason: reason.clone(),
            });
        }
    }
    merged
}

/// A number naming one drain among those this node asks for.
fn drain_number() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |age| age.as_nanos()),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(workers: &[(u64, u32)], left: u32, done: bool) -> Part {
        Part {
            progress: pb::DrainProgress {
                workers: workers
                    .iter()
                    .map(|(id, in_flight)| pb::DrainingWorker {
                        worker_id: *id,
                        in_flight: *in_flight,
                        ..Default::default()
                    })
                    .collect(),
                tasks_remaining: workers.iter().map(|(_, n)| n).sum(),
                workers_left: left,
                done,
                ..Default::default()
            },
            silent: None,
        }
    }

    #[test]
    fn a_drain_across_nodes_adds_up_and_ends_when_every_node_is_done() {
        let mut parts = BTreeMap::new();
        parts.insert("b".to_owned(), part(&[(7, 2)], 1, false));
        parts.insert("c".to_owned(), part(&[(7, 1), (9, 0)], 0, false));
        let merged = merge_progress(&parts, &[]);
        assert_eq!((merged.tasks_remaining, merged.workers_left), (3, 1));
        let named: Vec<(&str, u64)> = merged
            .workers
            .iter()
            .map(|w| (w.gateway_node.as_str(), w.worker_id))
            .collect();
        assert_eq!(
            named,
            [("b", 7), ("c", 7), ("c", 9)],
            "worker 7 on two nodes, both kept"
        );
        assert!(!merged.done);
        // Control: done only once the last node is done.
        parts.insert("b".to_owned(), part(&[], 2, true));
        assert!(!merge_progress(&parts, &[]).done);
        parts.insert("c".to_owned(), part(&[], 2, true));
        let merged = merge_progress(&parts, &[]);
        assert!(merged.done);
        assert_eq!(merged.workers_left, 4);
    }
}
