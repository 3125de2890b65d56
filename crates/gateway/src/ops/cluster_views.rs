//! The operations views across a cluster: `/v1/workers` lists every node's workers (each
//! with `gateway_node`, paged after the merge), `/v1/pools` and `/v1/unserved` list each
//! node's rows with the node they come from, and `/v1/explain` lists every node's workers of
//! the pool. Nodes that did not answer are listed in
//! `silent_nodes` (`{node, reason}`); outside a cluster the views are unchanged.

use serde_json::{Value, json};
use switchyard_proto::v1 as pb;

use super::query::Query;
use super::workers::page_bounds;
use crate::api::ClusterViews;

fn tag(node: &str, items: &mut [Value]) {
    for item in items {
        if let Some(object) = item.as_object_mut() {
            object.insert("gateway_node".to_owned(), Value::String(node.to_owned()));
        }
    }
}

fn silent_json(silent: &[pb::SilentNode]) -> Value {
    Value::Array(
        silent
            .iter()
            .map(|s| json!({ "node": s.node, "reason": s.reason }))
            .collect(),
    )
}

/// Counts by key, summed over nodes (the `/v1/workers` facets).
fn sum_counts(into: &mut Value, more: &Value) {
    let (Some(into), Some(more)) = (into.as_object_mut(), more.as_object()) else {
        return;
    };
    for (key, value) in more {
        let sum = into.get(key).and_then(Value::as_u64).unwrap_or(0) + value.as_u64().unwrap_or(0);
        into.insert(key.clone(), Value::from(sum));
    }
}

/// Every node's unpaged `/v1/workers` body merged, then paged as `query` asks.
pub(crate) fn merge_workers(
    parts: Vec<(String, Value)>,
    silent: &[pb::SilentNode],
    query: &Query,
) -> Value {
    let mut workers = Vec::new();
    let mut registered = 0u64;
    let mut facets = json!({ "nodes": {}, "transports": {}, "standings": {} });
    for (node, mut part) in parts {
        if let Some(Value::Array(list)) = part.get_mut("workers") {
            tag(&node, list);
            workers.append(list);
        }
        registered += part.get("registered").and_then(Value::as_u64).unwrap_or(0);
        for facet in ["nodes", "transports", "standings"] {
            if let (Some(into), Some(more)) = (facets.get_mut(facet), part.get(facet)) {
                sum_counts(into, more);
            }
        }
    }
    let key = |w: &Value| {
        (
            w.get("gateway_node")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            w.get("worker_id").and_then(Value::as_u64).unwrap_or(0),
        )
    };
    workers.sort_by_key(key);
    let total = workers.len();
    let (offset, limit) = page_bounds(query);
    let page: Vec<Value> = workers.into_iter().skip(offset).take(limit).collect();
    json!({
        "workers": page,
        "total": total,
        "offset": offset,
        "registered": registered,
        "nodes": facets["nodes"],
        "transports": facets["transports"],
        "standings": facets["standings"],
        "silent_nodes": silent_json(silent),
    })
}

/// `local` (a body holding one list under `view`) with every other node's rows appended,
/// each row carrying `gateway_node`; unchanged outside a cluster.
pub(crate) async fn listed(views: Option<&ClusterViews>, view: &str, local: Value) -> Value {
    merged(views, view, view, "", local).await
}

/// `local`, whose rows are the list under `rows`, with the rows every other node answers to
/// `view` (asked with `query`) appended, each row carrying `gateway_node`, and the nodes that
/// did not answer under `silent_nodes`; unchanged outside a cluster.
pub(crate) async fn merged(
    views: Option<&ClusterViews>,
    view: &str,
    rows: &str,
    query: &str,
    mut local: Value,
) -> Value {
    let Some(views) = views else {
        return local;
    };
    let (answers, silent) = views.ops(view, query).await;
    let mut all = Vec::new();
    let mut parts = vec![(views.node().to_owned(), local.clone())];
    parts.extend(answers);
    for (node, mut part) in parts {
        if let Some(Value::Array(list)) = part.get_mut(rows) {
            tag(&node, list);
            all.append(list);
        }
    }
    if let Some(object) = local.as_object_mut() {
        object.insert(rows.to_owned(), Value::Array(all));
        object.insert("silent_nodes".to_owned(), silent_json(&silent));
    }
    local
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(ids: &[u64], node_label: &str) -> Value {
        let workers: Vec<Value> = ids.iter().map(|id| json!({ "worker_id": id })).collect();
        json!({
            "workers": workers,
            "registered": ids.len(),
            "nodes": { node_label: ids.len() },
            "transports": { "grpc": ids.len() },
            "standings": {},
        })
    }

    #[test]
    fn workers_of_every_node_are_merged_tagged_and_paged_after_the_merge() {
        let silent = [pb::SilentNode {
            node: "d".to_owned(),
            reason: "no answer within 2000 ms".to_owned(),
        }];
        let parts = vec![
            ("a".to_owned(), body(&[1, 2], "-")),
            ("c".to_owned(), body(&[1], "rack1")),
        ];
        let merged = merge_workers(parts.clone(), &silent, &Query::default());
        let listed: Vec<(String, u64)> = merged["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                (
                    w["gateway_node"].as_str().unwrap().to_owned(),
                    w["worker_id"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(listed, [("a".into(), 1), ("a".into(), 2), ("c".into(), 1)]);
        assert_eq!(merged["registered"], 3);
        assert_eq!(merged["transports"]["grpc"], 3);
        assert_eq!(merged["nodes"]["rack1"], 1);
        assert_eq!(merged["silent_nodes"][0]["node"], "d");
        // Control: a page is cut from the merged list, not from each node's.
        let page = merge_workers(parts, &[], &Query::parse("offset=1&limit=1"));
        assert_eq!(page["total"], 3);
        assert_eq!(page["workers"].as_array().unwrap().len(), 1);
        assert_eq!(page["workers"][0]["worker_id"], 2);
    }
}
