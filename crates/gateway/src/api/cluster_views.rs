//! Cluster-wide views: `ListWorkers`, `DescribePool`, `ExplainPool` and `UnservedQueues` asked
//! on any node answer for every node.
//!
//! The asking node runs the call for its own workers, asks every other live member the same
//! call through the cluster's admin subject (carrying the caller as it authenticated them, so
//! each node applies the same grants and redaction), and merges: workers and queues are listed
//! with the gateway node they are on, a pool's counts are summed with one part per node, and a
//! node that did not answer within [`ASK_TIMEOUT`] is named in `silent_nodes`, never dropped
//! silently. [`super::cluster_answer::ViewsHandler`] is the answering side.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;
use serde::{Deserialize, Serialize};
use switchyard_cluster::{ASK_TIMEOUT, Admin};
use switchyard_core::{CallerIdentity, NamespaceGrant, Role};
use switchyard_proto::v1 as pb;

use super::service::GatewayApi;

pub(super) const LIST_WORKERS: &str = "ListWorkers";
pub(super) const DESCRIBE_POOL: &str = "DescribePool";
pub(super) const EXPLAIN_POOL: &str = "ExplainPool";
pub(super) const UNSERVED_QUEUES: &str = "UnservedQueues";
pub(super) const DRAIN_START: &str = "DrainStart";
pub(super) const DRAIN_STATUS: &str = "DrainStatus";
/// Prefix of the operations listener's views (`ops.workers`, `ops.pools`, `ops.unserved`).
pub(crate) const OPS: &str = "ops.";

/// Who asks, as the asking node authenticated them, and the drain a drain call belongs to.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct CallContext {
    principal: String,
    /// `None` for every namespace.
    namespaces: Option<Vec<String>>,
    roles: Vec<String>,
    #[serde(default)]
    pub(super) drain: u64,
}

impl CallContext {
    pub(super) fn of(caller: &CallerIdentity, drain: u64) -> String {
        let context = Self {
            principal: caller.principal.clone(),
            namespaces: match &caller.grant {
                NamespaceGrant::All => None,
                NamespaceGrant::Only(set) => Some(set.iter().cloned().collect()),
            },
            roles: caller.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            drain,
        };
        serde_json::to_string(&context).unwrap_or_default()
    }

    pub(super) fn read(text: &str) -> Result<(CallerIdentity, u64), String> {
        let context: Self =
            serde_json::from_str(text).map_err(|e| format!("unreadable caller: {e}"))?;
        let mut caller = match context.namespaces {
            None => CallerIdentity::trusted(context.principal),
            Some(namespaces) => CallerIdentity::granted(context.principal, namespaces),
        };
        caller = caller.with_roles(context.roles.iter().filter_map(|r| Role::from_name(r)));
        Ok((caller, context.drain))
    }
}

/// The asking side: this node's admin handle.
#[derive(Debug)]
pub(crate) struct ClusterViews {
    pub(super) admin: Admin,
}

/// The answers of the other nodes, decoded, and the nodes that gave none.
pub(super) struct Answers<R> {
    pub(super) answers: Vec<(String, R)>,
    pub(super) silent: Vec<pb::SilentNode>,
}

impl ClusterViews {
    pub(crate) fn new(admin: Admin) -> Self {
        Self { admin }
    }

    pub(crate) fn node(&self) -> &str {
        self.admin.node()
    }

    /// Asks every other node `call` with `request` and decodes their answers as `R`.
    pub(super) async fn ask<R: Message + Default>(
        &self,
        call: &str,
        context: &str,
        request: &impl Message,
    ) -> Answers<R> {
        let gathered = self
            .admin
            .ask_others(call, context, request.encode_to_vec().into(), ASK_TIMEOUT)
            .await;
        let mut silent: Vec<pb::SilentNode> = gathered.silent.into_iter().map(silent).collect();
        let mut answers = Vec::new();
        for answer in gathered.answers {
            match R::decode(answer.body) {
                Ok(reply) => answers.push((answer.node, reply)),
                Err(error) => silent.push(pb::SilentNode {
                    node: answer.node,
                    reason: format!("unreadable answer: {error}"),
                }),
            }
        }
        Answers { answers, silent }
    }

    pub(super) async fn list_workers(
        &self,
        caller: &CallerIdentity,
        filter: &pb::ListWorkersRequest,
        local: pb::ListWorkersReply,
    ) -> pb::ListWorkersReply {
        let asked: Answers<pb::ListWorkersReply> = self
            .ask(LIST_WORKERS, &CallContext::of(caller, 0), filter)
            .await;
        let mut workers = tagged_workers(self.node(), local.workers);
        for (node, reply) in asked.answers {
            workers.extend(tagged_workers(&node, reply.workers));
        }
        workers.sort_by(|a, b| (&a.gateway_node, a.worker_id).cmp(&(&b.gateway_node, b.worker_id)));
        pb::ListWorkersReply {
            workers,
            silent_nodes: asked.silent,
        }
    }

    pub(super) async fn explain_pool(
        &self,
        caller: &CallerIdentity,
        request: &pb::ExplainPoolRequest,
        local: pb::ExplainPoolReply,
    ) -> pb::ExplainPoolReply {
        let asked: Answers<pb::ExplainPoolReply> = self
            .ask(EXPLAIN_POOL, &CallContext::of(caller, 0), request)
            .await;
        let mut workers = tagged_explanations(self.node(), local.workers);
        for (node, reply) in asked.answers {
            workers.extend(tagged_explanations(&node, reply.workers));
        }
        let key = |w: &pb::WorkerExplanation| {
            w.worker
                .as_ref()
                .map(|w| (w.gateway_node.clone(), w.worker_id))
        };
        workers.sort_by_key(key);
        pb::ExplainPoolReply {
            workers,
            silent_nodes: asked.silent,
        }
    }

    pub(super) async fn unserved_queues(
        &self,
        caller: &CallerIdentity,
        local: pb::UnservedQueuesReply,
    ) -> pb::UnservedQueuesReply {
        let asked: Answers<pb::UnservedQueuesReply> = self
            .ask(
                UNSERVED_QUEUES,
                &CallContext::of(caller, 0),
                &pb::UnservedQueuesRequest {},
            )
            .await;
        let mut parts = vec![(self.node().to_owned(), local)];
        parts.extend(asked.answers);
        merge_unserved(parts, asked.silent)
    }

    pub(super) async fn describe_pool(
        &self,
        caller: &CallerIdentity,
        request: &pb::DescribePoolRequest,
        local: pb::DescribePoolReply,
    ) -> pb::DescribePoolReply {
        let asked: Answers<pb::DescribePoolReply> = self
            .ask(DESCRIBE_POOL, &CallContext::of(caller, 0), request)
            .await;
        let mut parts = vec![local];
        parts.extend(asked.answers.into_iter().map(|(_, reply)| reply));
        merge_describe(parts, asked.silent)
    }

    /// Asks every other node for one of the operations listener's views (`ops.<view>`,
    /// `query` its query string); each answer is that node's JSON.
    pub(crate) async fn ops(
        &self,
        view: &str,
        query: &str,
    ) -> (Vec<(String, serde_json::Value)>, Vec<pb::SilentNode>) {
        let gathered = self
            .admin
            .ask_others(
                &format!("{OPS}{view}"),
                "",
                Bytes::copy_from_slice(query.as_bytes()),
                ASK_TIMEOUT,
            )
            .await;
        let mut silent: Vec<pb::SilentNode> = gathered.silent.into_iter().map(silent).collect();
        let mut answers = Vec::new();
        for answer in gathered.answers {
            match serde_json::from_slice(&answer.body) {
                Ok(json) => answers.push((answer.node, json)),
                Err(error) => silent.push(pb::SilentNode {
                    node: answer.node,
                    reason: format!("unreadable answer: {error}"),
                }),
            }
        }
        (answers, silent)
    }
}

fn silent(node: switchyard_cluster::SilentNode) -> pb::SilentNode {
    pb::SilentNode {
        node: node.node,
        reason: node.reason,
    }
}

fn tagged_workers(node: &str, mut workers: Vec<pb::WorkerInfo>) -> Vec<pb::WorkerInfo> {
    for worker in &mut workers {
        node.clone_into(&mut worker.gateway_node);
    }
    workers
}

fn tagged_explanations(
    node: &str,
    mut workers: Vec<pb::WorkerExplanation>,
) -> Vec<pb::WorkerExplanation> {
    for explained in &mut workers {
        if let Some(worker) = &mut explained.worker {
            node.clone_into(&mut worker.gateway_node);
        }
    }
    workers
}

/// Every node's parked queues with their gateway node, and the durable backlog summed per
/// address (each node has its own dispatch store).
fn merge_unserved(
    parts: Vec<(String, pb::UnservedQueuesReply)>,
    silent_nodes: Vec<pb::SilentNode>,
) -> pb::UnservedQueuesReply {
    let mut queues = Vec::new();
    let mut backlog: BTreeMap<(String, String, String), pb::DurableBacklog> = BTreeMap::new();
    for (node, reply) in parts {
        for mut queue in reply.queues {
            queue.gateway_node.clone_from(&node);
            queues.push(queue);
        }
        for b in reply.backlog {
            let key = (
                b.namespace.clone(),
                b.task_queue.clone(),
                b.activity_type.clone(),
            );
            let sum = backlog.entry(key).or_insert_with(|| pb::DurableBacklog {
                namespace: b.namespace.clone(),
                task_queue: b.task_queue.clone(),
                activity_type: b.activity_type.clone(),
                ..pb::DurableBacklog::default()
            });
            sum.waiting += b.waiting;
            sum.running += b.running;
            sum.oldest_waiting_ms = sum.oldest_waiting_ms.max(b.oldest_waiting_ms);
        }
    }
    queues.sort_by(|a, b| {
        (
            &a.namespace,
            &a.task_queue,
            &a.activity_type,
            &a.node,
            &a.gateway_node,
        )
            .cmp(&(
                &b.namespace,
                &b.task_queue,
                &b.activity_type,
                &b.node,
                &b.gateway_node,
            ))
    });
    pb::UnservedQueuesReply {
        queues,
        backlog: backlog.into_values().collect(),
        silent_nodes,
    }
}

/// One pool across nodes: each part carries its own node's `nodes` entry; the counts are
/// summed, the oldest waits are the largest, and the pool is served when any node serves it
/// (a dispatch anywhere is forwarded to that node).
pub(super) fn merge_describe(
    parts: Vec<pb::DescribePoolReply>,
    silent_nodes: Vec<pb::SilentNode>,
) -> pb::DescribePoolReply {
    let mut merged = pb::DescribePoolReply {
        census: Some(pb::PoolCensus::default()),
        served: false,
        silent_nodes,
        ..pb::DescribePoolReply::default()
    };
    let mut unserved: Option<(i32, String)> = None;
    for part in parts {
        if let (Some(sum), Some(census)) = (&mut merged.census, &part.census) {
            add_census(sum, census);
        }
        merged.served |= part.served;
        let no_workers = part.reason == pb::UnservedReason::NoWorkers as i32;
        if !part.served && (unserved.is_none() || !no_workers) {
            // A reason other than "no workers" says more about the pool than a node that
            // has none.
            if unserved
                .as_ref()
                .is_none_or(|(reason, _)| *reason == pb::UnservedReason::NoWorkers as i32)
            {
                unserved = Some((part.reason, part.detail.clone()));
            }
        }
        merged.parked = merged.parked.saturating_add(part.parked);
        merged.oldest_parked_ms = merged.oldest_parked_ms.max(part.oldest_parked_ms);
        merged.backlog_waiting += part.backlog_waiting;
        merged.backlog_running += part.backlog_running;
        merged.backlog_oldest_waiting_ms = merged
            .backlog_oldest_waiting_ms
            .max(part.backlog_oldest_waiting_ms);
        merged.nodes.extend(part.nodes);
    }
    if !merged.served
        && let Some((reason, detail)) = unserved
    {
        merged.reason = reason;
        merged.detail = detail;
    }
    merged
        .nodes
        .sort_by(|a, b| a.gateway_node.cmp(&b.gateway_node));
    merged
}

fn add_census(sum: &mut pb::PoolCensus, c: &pb::PoolCensus) {
    sum.pool_workers += c.pool_workers;
    sum.activity_workers += c.activity_workers;
    sum.compatible += c.compatible;
    sum.at_capacity += c.at_capacity;
    sum.capacity_unannounced += c.capacity_unannounced;
    sum.on_probation += c.on_probation;
    sum.reachability_lost += c.reachability_lost;
    sum.draining += c.draining;
    sum.disconnected += c.disconnected;
    sum.eligible += c.eligible;
    sum.awaiting_streams += c.awaiting_streams;
    sum.unresponsive += c.unresponsive;
    sum.suspended += c.suspended;
    // The most recent departure anywhere; none once any node has a compatible worker.
    sum.last_compatible_departure_ms = if sum.compatible > 0 {
        None
    } else {
        match (
            sum.last_compatible_departure_ms,
            c.last_compatible_departure_ms,
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    };
    sum.suspended_grace_left_ms = match (sum.suspended_grace_left_ms, c.suspended_grace_left_ms) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
}

/// This node's part of a pool, as its `nodes` entry.
pub(super) fn own_part(
    api: &GatewayApi,
    node: &str,
    request: &pb::DescribePoolRequest,
    mut reply: pb::DescribePoolReply,
) -> pb::DescribePoolReply {
    let (capacity, in_flight) = api.local_pool_load(request);
    reply.nodes = vec![pb::NodePool {
        gateway_node: node.to_owned(),
        census: reply.census,
        parked: reply.parked,
        oldest_parked_ms: reply.oldest_parked_ms,
        capacity,
        in_flight,
    }];
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(
        node: &str,
        eligible: u32,
        reason: pb::UnservedReason,
        parked: u32,
    ) -> pb::DescribePoolReply {
        pb::DescribePoolReply {
            census: Some(pb::PoolCensus {
                pool_workers: eligible + 1,
                compatible: eligible + 1,
                eligible,
                ..pb::PoolCensus::default()
            }),
            served: eligible > 0,
            reason: reason.into(),
            detail: format!("{node} detail"),
            parked,
            oldest_parked_ms: u64::from(parked) * 10,
            nodes: vec![pb::NodePool {
                gateway_node: node.to_owned(),
                ..pb::NodePool::default()
            }],
            ..pb::DescribePoolReply::default()
        }
    }

    #[test]
    fn a_pool_across_nodes_sums_counts_and_is_served_when_any_node_serves_it() {
        let merged = merge_describe(
            vec![
                part("a", 0, pb::UnservedReason::AllAtCapacity, 2),
                part("c", 3, pb::UnservedReason::Unspecified, 0),
            ],
            vec![],
        );
        let census = merged.census.unwrap();
        assert_eq!((census.pool_workers, census.eligible), (5, 3));
        assert_eq!((merged.parked, merged.oldest_parked_ms), (2, 20));
        assert!(merged.served, "c serves it");
        let nodes: Vec<&str> = merged
            .nodes
            .iter()
            .map(|n| n.gateway_node.as_str())
            .collect();
        assert_eq!(nodes, ["a", "c"]);
        // Control: with no node serving it, the reason says more than "no workers".
        let merged = merge_describe(
            vec![
                part("a", 0, pb::UnservedReason::NoWorkers, 0),
                part("b", 0, pb::UnservedReason::AllAtCapacity, 1),
            ],
            vec![pb::SilentNode {
                node: "c".to_owned(),
                reason: "no answer".to_owned(),
            }],
        );
        assert!(!merged.served);
        assert_eq!(merged.reason, pb::UnservedReason::AllAtCapacity as i32);
        assert_eq!(merged.detail, "b detail");
        assert_eq!(merged.silent_nodes.len(), 1);
    }

    #[test]
    fn the_caller_crosses_nodes_with_its_grant_and_roles() {
        let caller = CallerIdentity::granted("ops1", ["billing"]).with_roles([Role::Operator]);
        let (read, drain) = CallContext::read(&CallContext::of(&caller, 7)).unwrap();
        assert_eq!(read, caller);
        assert_eq!(drain, 7);
        // Control: a trusted caller stays granted everything, not nothing.
        let (read, _) =
            CallContext::read(&CallContext::of(&CallerIdentity::trusted("dev"), 0)).unwrap();
        assert!(read.grant.allows("anything") && read.has_role(Role::Operator));
        assert!(CallContext::read("not json").is_err());
    }

    #[test]
    fn queues_carry_their_node_and_backlogs_sum_per_address() {
        let queue = |ns: &str| pb::UnservedQueueInfo {
            namespace: ns.to_owned(),
            ..pb::UnservedQueueInfo::default()
        };
        let backlog = |waiting| pb::DurableBacklog {
            namespace: "n".to_owned(),
            waiting,
            ..pb::DurableBacklog::default()
        };
        let merged = merge_unserved(
            vec![
                (
                    "b".to_owned(),
                    pb::UnservedQueuesReply {
                        queues: vec![queue("n")],
                        backlog: vec![backlog(2)],
                        ..Default::default()
                    },
                ),
                (
                    "a".to_owned(),
                    pb::UnservedQueuesReply {
                        queues: vec![queue("n")],
                        backlog: vec![backlog(3)],
                        ..Default::default()
                    },
                ),
            ],
            vec![],
        );
        let nodes: Vec<&str> = merged
            .queues
            .iter()
            .map(|q| q.gateway_node.as_str())
            .collect();
        assert_eq!(nodes, ["a", "b"]);
        assert_eq!(merged.backlog.len(), 1);
        assert_eq!(merged.backlog[0].waiting, 5);
    }
}
