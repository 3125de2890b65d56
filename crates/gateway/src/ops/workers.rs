//! `/v1/workers`: the registered workers, filtered by node, transport and standing, one page
//! at a time when asked (`offset`, `limit`), with the values the filters can take.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_core::{Eligibility, WorkerSnapshot};

use super::query::Query;

/// The largest page `limit` may ask for.
pub(crate) const MAX_PAGE: usize = 500;

/// The `node` filter value that selects workers advertising no node.
pub(crate) const NO_NODE: &str = "-";

/// A short word for a worker's standing, the console's filter and colour.
pub(crate) fn standing(eligibility: &Eligibility) -> &'static str {
    match eligibility {
        Eligibility::Eligible => "eligible",
        Eligibility::AtCapacity { .. } => "at_capacity",
        Eligibility::CapacityUnannounced => "capacity_unannounced",
        Eligibility::AwaitingStreams { .. } => "awaiting_streams",
        Eligibility::OnProbation => "probation",
        Eligibility::Unreachable => "unreachable",
        Eligibility::Draining => "draining",
        Eligibility::Disconnected => "disconnected",
        Eligibility::Suspended => "suspended",
        Eligibility::ServesOtherActivity => "serves_other_activity",
        Eligibility::OtherNode { .. } => "other_node",
        _ => "other",
    }
}

/// One worker as JSON.
pub(crate) fn worker_json(s: &WorkerSnapshot) -> Value {
    let w = &s.worker;
    json!({
        "worker_id": w.id().get(),
        "identity": w.identity(),
        "principal": w.principal(),
        "transport": w.transport().as_str(),
        "namespaces": w.namespaces(),
        "task_queue": w.task_queue(),
        "node": w.node().map(|n| n.as_str()),
        "activity_types": w.activity_types(),
        "capacity": s.capacity,
        "in_flight": s.in_flight,
        "unresponsive_tasks": s.unresponsive,
        "eligibility": s.eligibility.to_string(),
        "standing": standing(&s.eligibility),
        "suspended_for_ms": s.suspended_for.map(|left| left.as_millis() as u64),
        "connected_since_unix_ms": crate::api::unix_ms(s.connected_at),
    })
}

fn matches(s: &WorkerSnapshot, query: &Query) -> bool {
    let w = &s.worker;
    let node = w.node().map_or(NO_NODE, |n| n.as_str());
    query.get("node").is_none_or(|want| want == node)
        && query
            .get("transport")
            .is_none_or(|want| want == w.transport().as_str())
        && query
            .get("standing")
            .is_none_or(|want| want == standing(&s.eligibility))
}

/// The page `query` asks for: `(offset, limit)`; every row without `offset` or `limit`,
/// else at most [`MAX_PAGE`].
pub(crate) fn page_bounds(query: &Query) -> (usize, usize) {
    let paged = query.get("offset").is_some() || query.get("limit").is_some();
    let offset = query.number("offset").unwrap_or(0);
    let limit = if paged {
        query.number("limit").unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE)
    } else {
        usize::MAX
    };
    (offset, limit)
}

/// The `/v1/workers` body for `snapshots` (ordered by id) and the request's `query`.
///
/// Without `offset` or `limit` every matching worker is listed, as before paging existed;
/// with either, one page of at most [`MAX_PAGE`].
pub(crate) fn page(snapshots: &[WorkerSnapshot], query: &Query) -> Value {
    let mut nodes = BTreeMap::<&str, u64>::new();
    let mut transports = BTreeMap::<&str, u64>::new();
    let mut standings = BTreeMap::<&str, u64>::new();
    for s in snapshots {
        *nodes
            .entry(s.worker.node().map_or(NO_NODE, |n| n.as_str()))
            .or_default() += 1;
        *transports.entry(s.worker.transport().as_str()).or_default() += 1;
        *standings.entry(standing(&s.eligibility)).or_default() += 1;
    }
    let matching = snapshots.iter().filter(|s| matches(s, query));
    let (offset, limit) = page_bounds(query);
    let mut total = 0usize;
    let mut workers = Vec::new();
    for (i, s) in matching.enumerate() {
        total += 1;
        if i >= offset && workers.len() < limit {
            workers.push(worker_json(s));
        }
    }
    json!({
        "workers": workers,
        "total": total,
        "offset": offset,
        "registered": snapshots.len(),
        "nodes": nodes,
        "transports": transports,
        "standings": standings,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use switchyard_core::{
        CallerIdentity, Core, CoreConfig, DeliveryError, Registration, Registry, TransportName,
        WorkerDelivery, WorkerMessage,
    };

    use super::*;

    struct Leg(&'static str);

    impl WorkerDelivery for Leg {
        fn transport(&self) -> TransportName {
            TransportName::from_static(self.0)
        }
        fn is_connected(&self) -> bool {
            true
        }
        fn registration_carries_capacity(&self) -> bool {
            true
        }
        fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> {
            Ok(())
        }
    }

    /// A core with `n` workers: even ones on gRPC at node `a`, odd ones on QUIC at no node.
    async fn fleet(n: usize) -> (Core, Vec<switchyard_core::RegistrationToken>) {
        let core = Core::start(Registry::builder(), CoreConfig::default());
        let caller = CallerIdentity::trusted("ops");
        let mut tokens = Vec::new();
        for i in 0..n {
            let registration = Registration {
                namespaces: ["default".to_owned()].into(),
                activity_types: ["work".to_owned()].into(),
                max_concurrency: Some(2),
                node: (i % 2 == 0)
                    .then(|| switchyard_core::Node::new("a"))
                    .flatten(),
                ..Registration::default()
            };
            let leg = Arc::new(Leg(if i % 2 == 0 { "grpc" } else { "quic" }));
            tokens.push(
                core.registry()
                    .admit(&caller, registration, leg)
                    .await
                    .unwrap(),
            );
        }
        (core, tokens)
    }

    fn ids(body: &Value) -> Vec<u64> {
        body["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["worker_id"].as_u64().unwrap())
            .collect()
    }

    /// `docs/operations.md`, `/v1/workers`: every field of a row, and the body's counts.
    #[tokio::test]
    async fn a_row_carries_every_documented_field() {
        let core = Core::start(Registry::builder(), CoreConfig::default());
        let caller = CallerIdentity::trusted("shop");
        let registration = Registration {
            identity: "pod-7".to_owned(),
            namespaces: ["billing".to_owned()].into(),
            task_queue: "invoices".to_owned(),
            activity_types: ["charge".to_owned()].into(),
            max_concurrency: Some(4),
            node: switchyard_core::Node::new("rack-a"),
            ..Registration::default()
        };
        let before = crate::api::unix_ms(std::time::SystemTime::now());
        let _token = core
            .registry()
            .admit(&caller, registration, Arc::new(Leg("grpc")))
            .await
            .unwrap();
        let body = page(
            &core.registry().workers(),
            &Query::parse("offset=0&limit=10"),
        );
        let row = &body["workers"][0];
        let id = row["worker_id"].as_u64().unwrap();
        assert!(id > 0);
        assert_eq!(row["identity"], "pod-7");
        assert_eq!(row["principal"], "shop");
        assert_eq!(row["transport"], "grpc");
        assert_eq!(row["namespaces"], json!(["billing"]));
        assert_eq!(row["task_queue"], "invoices");
        assert_eq!(row["node"], "rack-a");
        assert_eq!(row["activity_types"], json!(["charge"]));
        assert_eq!(row["capacity"], 4);
        assert_eq!(row["in_flight"], 0);
        assert_eq!(row["unresponsive_tasks"], 0);
        assert!(row["eligibility"].is_string(), "{row}");
        assert!(row["standing"].is_string(), "{row}");
        assert_eq!(row["suspended_for_ms"], Value::Null, "not suspended");
        let since = row["connected_since_unix_ms"].as_u64().unwrap();
        assert!(
            since >= before && since <= before + 60_000,
            "{since} vs {before}"
        );
        let documented = [
            "worker_id",
            "identity",
            "principal",
            "transport",
            "namespaces",
            "task_queue",
            "node",
            "activity_types",
            "capacity",
            "in_flight",
            "unresponsive_tasks",
            "eligibility",
            "standing",
            "suspended_for_ms",
            "connected_since_unix_ms",
        ];
        let mut fields: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort_unstable();
        let mut expected = documented.to_vec();
        expected.sort_unstable();
        assert_eq!(
            fields, expected,
            "the row has exactly the documented fields"
        );
        assert_eq!(
            (&body["total"], &body["offset"], &body["registered"]),
            (&json!(1), &json!(0), &json!(1))
        );
        assert_eq!(body["nodes"], json!({ "rack-a": 1 }));
        assert_eq!(body["transports"], json!({ "grpc": 1 }));
    }

    #[tokio::test]
    async fn pages_are_bounded_and_filters_apply_before_paging() {
        let (core, _tokens) = fleet(1_000).await;
        let all = core.registry().workers();

        let first = page(&all, &Query::parse("offset=0&limit=50"));
        assert_eq!(ids(&first).len(), 50);
        assert_eq!(first["total"], 1_000);
        assert_eq!(first["transports"]["grpc"], 500);
        assert_eq!(first["nodes"]["a"], 500);
        assert_eq!(first["nodes"][NO_NODE], 500);

        let huge = page(&all, &Query::parse("limit=100000"));
        assert_eq!(ids(&huge).len(), MAX_PAGE);

        let quic = page(&all, &Query::parse("transport=quic&offset=490&limit=50"));
        assert_eq!(quic["total"], 500);
        assert_eq!(ids(&quic).len(), 10, "the last 10 of 500");
        let expected: Vec<u64> = all
            .iter()
            .filter(|s| s.worker.transport().as_str() == "quic")
            .skip(490)
            .map(|s| s.worker.id().get())
            .collect();
        assert_eq!(ids(&quic), expected);

        let unlabelled = page(&all, &Query::parse(&format!("node={NO_NODE}&limit=5")));
        assert_eq!(unlabelled["total"], 500);
        assert!(
            unlabelled["workers"]
                .as_array()
                .unwrap()
                .iter()
                .all(|w| w["node"].is_null())
        );

        // Control: without paging parameters every worker is listed, as before.
        assert_eq!(ids(&page(&all, &Query::default())).len(), 1_000);
    }

    /// `docs/operations.md`, `/v1/workers`: ordered by id; the `standing` filter; `registered`
    /// and `standings` count every worker whatever the filters.
    #[tokio::test]
    async fn workers_are_ordered_by_id_and_filtered_by_standing() {
        let (core, tokens) = fleet(20).await;
        let drained = tokens[7].worker_id();
        assert!(core.registry().drain_worker(drained));
        let all = core.registry().workers();
        let listed = ids(&page(&all, &Query::default()));
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        assert_eq!(listed, sorted, "ordered by id");
        assert_eq!(listed.len(), 20);

        let draining = page(&all, &Query::parse("standing=draining"));
        assert_eq!(ids(&draining), vec![drained.get()]);
        assert_eq!(draining["total"], 1);
        assert_eq!(
            draining["registered"], 20,
            "every worker, whatever the filter"
        );
        assert_eq!(draining["standings"]["draining"], 1);
        assert_eq!(draining["standings"]["probation"], 19);
        // Control: the other standing lists the rest.
        let probation = page(&all, &Query::parse("standing=probation"));
        assert_eq!(probation["total"], 19);
        assert!(!ids(&probation).contains(&drained.get()));
    }

    /// `docs/operations.md`: at most 500 workers a page.
    #[test]
    fn a_page_holds_at_most_the_documented_500() {
        assert_eq!(MAX_PAGE, 500);
    }
}
