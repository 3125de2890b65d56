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

    /// Keeps drain `key` from `now` with its first progress, after letting go of the ones
    /// finished [`KEEP_FINISHED`] ago; refused while [`MAX_REMOTE_DRAINS`] are kept.
    fn admit(
        &mut self,
        key: (String, u64),
        first: pb::DrainProgress,
        now: Instant,
    ) -> Result<(), Status> {
        self.prune(now);
        if self.drains.len() >= MAX_REMOTE_DRAINS {
            return Err(Status::resource_exhausted(format!(
                "{MAX_REMOTE_DRAINS} drains asked by other nodes are already kept here"
            )));
        }
        self.drains.insert(key, (first, None));
        Ok(())
    }

    /// Records drain `key`'s latest progress, finished (at `now`) when it says it is done.
    fn progressed(&mut self, key: (String, u64), progress: pb::DrainProgress, now: Instant) {
        let finished = progress.done.then_some(now);
        self.drains.insert(key, (progress, finished));
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
    drains
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .admit(key.clone(), first.clone(), Instant::now())?;
    let mut progress = api.local_drain(targets, request);
    let drains = Arc::clone(drains);
    tokio::spawn(async move {
        while let Some(Ok(now)) = progress.next().await {
            drains
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .progressed(key.clone(), now, Instant::now());
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

impl Part {
    /// Takes one poll's answer of this part's node (`live`: still a member): its progress;
    /// without one, the last progress stays and the node is named silent, or counts as done
    /// once it has left the cluster (its workers left with it).
    fn hear(&mut self, answer: Result<Bytes, String>, live: bool) {
        match answer.map(pb::DrainProgress::decode) {
            Ok(Ok(progress)) => {
                self.progress = progress;
                self.silent = None;
            }
            Ok(Err(error)) => self.silent = Some(format!("unreadable: {error}")),
            Err(_) if !live => {
                self.silent = Some("left the cluster".to_owned());
                self.progress.done = true;
            }
            Err(reason) => self.silent = Some(reason),
        }
    }
}

/// `NOT_FOUND` for a drain no answering node holds a match for, naming the nodes that did not
/// answer (one of them may hold it).
fn nothing_to_drain(silent: &[pb::SilentNode]) -> Status {
    let mut message = NOTHING_TO_DRAIN.to_owned();
    if !silent.is_empty() {
        let names: Vec<String> = silent
            .iter()
            .map(|s| format!("{} ({})", s.node, s.reason))
            .collect();
        message.push_str(&format!(
            "; nodes that did not answer: {}",
            names.join(", ")
        ));
    }
    Status::not_found(message)
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
            return Err(nothing_to_drain(&silent_at_start));
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
                            if let Some(part) = parts.get_mut(&node) {
                                part.hear(answer, live.contains(&node));
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

    fn progress_bytes(part: &Part) -> Result<Bytes, String> {
        Ok(part.progress.encode_to_vec().into())
    }

    #[test]
    fn a_node_that_stops_answering_is_named_silent_with_its_last_progress_kept() {
        let mut parts = BTreeMap::new();
        parts.insert("b".to_owned(), part(&[(7, 2)], 0, false));
        let b = parts.get_mut("b").unwrap();
        b.hear(Err("no answer within 1000 ms".to_owned()), true);
        let merged = merge_progress(&parts, &[]);
        assert_eq!(
            merged.tasks_remaining, 2,
            "the last progress stays in the sum"
        );
        assert_eq!(merged.silent_nodes.len(), 1);
        assert_eq!(merged.silent_nodes[0].node, "b");
        assert_eq!(merged.silent_nodes[0].reason, "no answer within 1000 ms");
        assert!(!merged.done, "a silent node is not done");
        // Control: its next answer replaces the progress and it is no longer named.
        let answered = part(&[(7, 1)], 0, false);
        let b = parts.get_mut("b").unwrap();
        b.hear(progress_bytes(&answered), true);
        let merged = merge_progress(&parts, &[]);
        assert_eq!(merged.tasks_remaining, 1);
        assert!(merged.silent_nodes.is_empty());
    }

    #[test]
    fn a_node_that_left_the_cluster_counts_as_done() {
        let mut parts = BTreeMap::new();
        parts.insert("b".to_owned(), part(&[(7, 2)], 0, false));
        parts.insert("c".to_owned(), part(&[], 1, true));
        parts
            .get_mut("b")
            .unwrap()
            .hear(Err("no responders".to_owned()), false);
        let merged = merge_progress(&parts, &[]);
        assert!(merged.done, "every part done: c finished, b left");
        assert_eq!(merged.silent_nodes[0].reason, "left the cluster");
        // Control: the same silence from a node still a member keeps the drain open.
        let mut parts = BTreeMap::new();
        parts.insert("b".to_owned(), part(&[(7, 2)], 0, false));
        parts
            .get_mut("b")
            .unwrap()
            .hear(Err("no responders".to_owned()), true);
        assert!(!merge_progress(&parts, &[]).done);
    }

    #[test]
    fn nothing_to_drain_names_the_nodes_that_did_not_answer() {
        let silent = [pb::SilentNode {
            node: "c".to_owned(),
            reason: "no answer within 2000 ms".to_owned(),
        }];
        let status = nothing_to_drain(&silent);
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(
            status.message(),
            format!("{NOTHING_TO_DRAIN}; nodes that did not answer: c (no answer within 2000 ms)")
        );
        // Control: with every node answering, the message is the single node's.
        assert_eq!(nothing_to_drain(&[]).message(), NOTHING_TO_DRAIN);
    }

    #[test]
    fn a_node_keeps_64_remote_drains_and_a_finished_one_for_60_s() {
        assert_eq!(
            (MAX_REMOTE_DRAINS, KEEP_FINISHED),
            (64, Duration::from_secs(60))
        );
        let start = Instant::now();
        let mut drains = RemoteDrains::default();
        for number in 0..64 {
            drains
                .admit(
                    ("a".to_owned(), number),
                    pb::DrainProgress::default(),
                    start,
                )
                .unwrap();
        }
        let refused = drains
            .admit(("a".to_owned(), 64), pb::DrainProgress::default(), start)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("64 drains asked by other nodes"),
            "{refused:?}"
        );
        // One finishes: it is kept (its asker's last poll reads it) for 60 s, then makes room.
        let finished = pb::DrainProgress {
            done: true,
            ..pb::DrainProgress::default()
        };
        drains.progressed(("a".to_owned(), 0), finished, start);
        let almost = start + KEEP_FINISHED - Duration::from_millis(1);
        assert!(
            drains
                .admit(("a".to_owned(), 64), pb::DrainProgress::default(), almost)
                .is_err()
        );
        assert!(drains.drains.contains_key(&("a".to_owned(), 0)));
        drains
            .admit(
                ("a".to_owned(), 64),
                pb::DrainProgress::default(),
                start + KEEP_FINISHED,
            )
            .unwrap();
        assert!(!drains.drains.contains_key(&("a".to_owned(), 0)));
        // Control: a running drain is never let go, however old.
        let late = start + KEEP_FINISHED * 10;
        assert!(
            drains
                .admit(("a".to_owned(), 65), pb::DrainProgress::default(), late)
                .is_err()
        );
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

    /// `docs/cluster.md`: a drain polls each node holding drained workers every 250 ms.
    #[test]
    fn a_drain_polls_at_the_documented_pace() {
        assert_eq!(POLL_EVERY, Duration::from_millis(250));
    }
}
