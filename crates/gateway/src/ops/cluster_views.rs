//! The operations views across a cluster: `/v1/workers` lists every node's workers (each
//! with `gateway_node`, paged after the merge), `/v1/pools` and `/v1/unserved` list each
//! node's rows with the node they come from, and `/v1/explain` lists every node's workers of
//! the pool, and `/v1/history` merges every node's counts and latency bins interval by interval
//! (each pool naming its `gateway_nodes`). Nodes that did not answer are listed in
//! `silent_nodes` (`{node, reason}`); outside a cluster the views are unchanged.

use std::time::SystemTime;

use serde_json::{Value, json};
use switchyard_proto::v1 as pb;

use super::history::{self, BUCKET, BUCKETS, Recorded};
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

/// `/v1/history`: this node's pools; in a cluster, every node's, merged.
///
/// A dispatch is counted by the node whose producer ran it (its origin), with the latency
/// that producer saw, whichever node's worker served it; the taker of a forwarded dispatch
/// does not count it, so the sum over nodes counts each dispatch once.
pub(crate) async fn history(views: Option<&ClusterViews>) -> Value {
    let now_unix_ms = crate::api::unix_ms(SystemTime::now());
    let Some(views) = views else {
        return json!({
            "bucket_seconds": BUCKET.as_secs(),
            "now_unix_ms": now_unix_ms,
            "pools": history::snapshot(),
        });
    };
    let local = history::recorded();
    let (answers, mut silent) = views.ops("history", "").await;
    let mut parts = Vec::new();
    for (node, answer) in answers {
        match serde_json::from_value::<Recorded>(answer) {
            Ok(recorded) => parts.push((node, recorded)),
            Err(error) => silent.push(pb::SilentNode {
                node,
                reason: format!("unreadable answer: {error}"),
            }),
        }
    }
    parts.push((views.node().to_owned(), local));
    merge_history(parts, &silent, now_unix_ms)
}

/// Every node's recorded history over the window ending at the asking node's interval (the
/// last part's): intervals are wall-clock aligned, so they are summed index by index.
fn merge_history(
    parts: Vec<(String, Recorded)>,
    silent: &[pb::SilentNode],
    now_unix_ms: u64,
) -> Value {
    let last = parts.last().map_or(0, |(_, own)| own.last);
    let oldest = last.saturating_sub(BUCKETS as u64 - 1);
    let first = parts
        .iter()
        .map(|(_, recorded)| recorded.first)
        .min()
        .unwrap_or(last)
        .max(oldest);
    let pools = history::merge(
        first,
        last,
        parts
            .into_iter()
            .map(|(node, recorded)| (Some(node), recorded)),
    );
    json!({
        "bucket_seconds": BUCKET.as_secs(),
        "now_unix_ms": now_unix_ms,
        "pools": pools,
        "silent_nodes": silent_json(silent),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::history::PoolHistory;
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

    /// A node's history with `latencies_ms` recorded into its pool `n/q` at `at`.
    fn node_history(wall: u64, latencies_ms: &[u64]) -> Recorded {
        let origin = Instant::now();
        let mut node = PoolHistory::new(origin, wall);
        let cell = node.pool("n", "q");
        for &ms in latencies_ms {
            cell.record("completed", Duration::from_millis(ms), origin);
        }
        node.recorded(origin)
    }

    #[test]
    fn history_merges_bins_so_the_merged_percentiles_are_those_of_the_union() {
        let wall = 1_700_000_000_000;
        // Node a: 60 fast dispatches; node b: 40 slow ones. Each node's own p50 is its own.
        let fast = vec![2; 60];
        let slow = vec![300; 40];
        let parts = vec![
            ("b".to_owned(), node_history(wall + 3_000, &slow)),
            ("a".to_owned(), node_history(wall, &fast)),
        ];
        let merged = merge_history(parts, &[], 0);
        let union = node_history(wall, &[fast.clone(), slow.clone()].concat());
        let union = history::merge(union.first, union.last, [(None, union)]);
        let pool = &merged["pools"][0];
        assert_eq!(pool["gateway_nodes"], json!(["a", "b"]));
        let point = pool["points"].as_array().unwrap().last().unwrap().clone();
        let expected = serde_json::to_value(union[0].points.last().unwrap()).unwrap();
        assert_eq!(point, expected, "the histogram of the union");
        assert_eq!(point["dispatches"], 100);
        // The union's p99 is the slow node's, its p50 the fast node's: 60 of 100 are fast.
        assert!(point["p50_ms"].as_f64().unwrap() < 3.0, "{point}");
        assert!(point["p99_ms"].as_f64().unwrap() >= 300.0, "{point}");
        // Control: averaging the nodes' own medians (2 ms and 300 ms) is not what it gives.
        let mean_of_medians = (2.0 + 300.0) / 2.0;
        assert!(point["p50_ms"].as_f64().unwrap() < mean_of_medians);
        assert_eq!(merged["silent_nodes"], json!([]));
    }

    #[test]
    fn history_intervals_line_up_on_the_wall_clock_across_nodes() {
        let wall = 1_700_000_000_000;
        // b started 4 s into the same 10 s interval as a: its dispatch lands in a's interval.
        let parts = vec![
            ("b".to_owned(), node_history(wall + 4_000, &[5])),
            ("a".to_owned(), node_history(wall, &[5])),
        ];
        let silent = [pb::SilentNode {
            node: "c".to_owned(),
            reason: "no answer within 2000 ms".to_owned(),
        }];
        let merged = merge_history(parts, &silent, 0);
        let points = merged["pools"][0]["points"].as_array().unwrap();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0]["dispatches"], 2);
        assert_eq!(merged["silent_nodes"][0]["node"], "c");
        // Control: a node whose dispatch fell in the next interval shows in the next point.
        let parts = vec![
            ("b".to_owned(), node_history(wall + 10_000, &[5])),
            ("a".to_owned(), node_history(wall + 10_000, &[])),
            ("a0".to_owned(), node_history(wall, &[5])),
        ];
        let mut parts = parts;
        parts.swap(1, 2);
        let merged = merge_history(parts, &[], 0);
        let points = merged["pools"][0]["points"].as_array().unwrap();
        let counts: Vec<u64> = points
            .iter()
            .map(|p| p["dispatches"].as_u64().unwrap())
            .collect();
        assert_eq!(counts, [1, 1]);
    }

    /// The dispatch counts of the merged pool, one per interval of the window.
    fn counts(merged: &Value) -> Vec<u64> {
        merged["pools"][0]["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["dispatches"].as_u64().unwrap())
            .collect()
    }

    #[test]
    fn a_node_whose_clock_is_fast_counts_a_dispatch_near_a_boundary_in_the_next_interval() {
        // The same moment, 5 s into a 10 s interval, on a's right clock and on b's, 6 s fast;
        // each node ends one dispatch of the pool then.
        let origin = Instant::now();
        let wall = 1_700_000_005_000;
        let node = |clock_ms: u64| {
            let mut node = PoolHistory::new(origin, clock_ms);
            node.pool("n", "q")
                .record("completed", Duration::from_millis(5), origin);
            node
        };
        let (mut a, mut b) = (node(wall), node(wall + 6_000));
        let asked_on_a = |a: &mut PoolHistory, b: &mut PoolHistory, at: Instant| {
            let parts = vec![
                ("b".to_owned(), b.recorded(at)),
                ("a".to_owned(), a.recorded(at)),
            ];
            counts(&merge_history(parts, &[], 0))
        };
        // Asked on a at once: b's dispatch is in an interval b has started and a has not, past
        // the window's end; only a's shows.
        assert_eq!(asked_on_a(&mut a, &mut b, origin), [1]);
        // At the next refresh, 5 s on, a is in that interval too: b's dispatch shows there, in
        // the neighbouring interval of a's, not beside it.
        assert_eq!(
            asked_on_a(&mut a, &mut b, origin + Duration::from_secs(5)),
            [1, 1]
        );
        // Control: with b's clock right, both dispatches are in one interval.
        let (mut a, mut b) = (node(wall), node(wall));
        assert_eq!(asked_on_a(&mut a, &mut b, origin), [2]);
    }

    fn sorted_keys(value: &Value) -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    #[tokio::test]
    async fn outside_a_cluster_history_keeps_its_fields_and_names_no_node() {
        history::pool("outside", "q").record("completed", Duration::from_millis(3), Instant::now());
        let body = history(None).await;
        assert_eq!(
            sorted_keys(&body),
            ["bucket_seconds", "now_unix_ms", "pools"]
        );
        let find = |body: &Value| {
            body["pools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["namespace"] == "outside")
                .cloned()
                .unwrap()
        };
        assert_eq!(
            sorted_keys(&find(&body)),
            ["namespace", "points", "task_queue"]
        );
        // Control: in a cluster the same pool names its nodes and the silent ones are listed.
        let merged = merge_history(vec![("a".to_owned(), history::recorded())], &[], 0);
        assert_eq!(merged["silent_nodes"], json!([]));
        assert_eq!(find(&merged)["gateway_nodes"], json!(["a"]));
    }
}
