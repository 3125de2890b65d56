//! The gate's policy steps: authorisation, namespace policy, placement, and the audit.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::{AdmissionError, RefusalKind};
use crate::address::Node;
use crate::namespace::{
    InMemoryNamespaceStore, NamespacePolicy, NamespaceRecord, NamespaceStore as _, Placement,
};
use crate::registration::{CallerIdentity, Registration};
use crate::registry::Registry;
use crate::registry::testing::{Admitted, listed, registration, try_admit};

fn nodes(labels: &[&str]) -> BTreeSet<Node> {
    labels
        .iter()
        .filter_map(|label| Node::new(*label))
        .collect()
}

fn record(name: &str, placement: Placement) -> NamespaceRecord {
    NamespaceRecord {
        name: name.to_owned(),
        placement,
    }
}

fn registry_over(store: &Arc<InMemoryNamespaceStore>, policy: NamespacePolicy) -> Registry {
    Registry::builder()
        .namespace_store(Arc::clone(store) as _)
        .namespace_policy(policy)
        .build()
}

async fn admit(
    registry: &Registry,
    registration: Registration,
) -> Result<Admitted, AdmissionError> {
    try_admit(registry, &CallerIdentity::trusted("tester"), registration).await
}

#[tokio::test]
async fn every_namespace_of_a_registration_must_be_granted() {
    let registry = Registry::default();
    let registration = registration(&["a", "b"], "", "", &["dev"]);

    let team_a = CallerIdentity::granted("team", ["a"]);
    let refusal = try_admit(&registry, &team_a, registration.clone())
        .await
        .unwrap_err();
    assert_eq!(
        refusal,
        AdmissionError::NamespaceNotGranted {
            principal: "team".to_owned(),
            namespace: "b".to_owned()
        }
    );
    assert_eq!(refusal.kind(), RefusalKind::Unauthorised);
    assert!(registry.is_empty());
    assert!(
        listed(&registry, "a", "", "dev", None).is_empty(),
        "no partial admit into a"
    );

    let team_ab = CallerIdentity::granted("team", ["a", "b"]);
    let _admitted = try_admit(&registry, &team_ab, registration).await.unwrap();
    assert_eq!(registry.len(), 1);
}

#[tokio::test]
async fn an_invalid_registration_is_refused_by_field_before_anything_else() {
    let store = Arc::new(InMemoryNamespaceStore::new());
    let registry = registry_over(&store, NamespacePolicy::Open);
    let mut bad = registration(&["fresh"], "", "", &["dev"]);
    bad.activity_types.clear();
    assert_eq!(
        admit(&registry, bad).await.unwrap_err(),
        AdmissionError::Empty {
            field: "activity_types"
        }
    );
    assert!(registry.is_empty());
    assert_eq!(
        store.creations(),
        0,
        "validation refuses before the namespace is minted"
    );
}

#[tokio::test]
async fn open_policy_mints_a_durable_record_once() {
    let store = Arc::new(InMemoryNamespaceStore::new());
    let registry = registry_over(&store, NamespacePolicy::Open);
    assert_eq!(store.get("orders").await.unwrap(), None);

    let _first = admit(&registry, registration(&["orders"], "", "", &["charge"]))
        .await
        .unwrap();
    assert_eq!(
        store.get("orders").await.unwrap(),
        Some(record("orders", Placement::Unplaced))
    );
    assert_eq!(store.creations(), 1);

    let _second = admit(&registry, registration(&["orders"], "", "", &["refund"]))
        .await
        .unwrap();
    assert_eq!(store.creations(), 1, "re-registering is idempotent");
    assert_eq!(registry.len(), 2);

    let _multi = admit(
        &registry,
        registration(&["orders", "alpha", "beta"], "", "", &["x"]),
    )
    .await
    .unwrap();
    assert_eq!(
        store.creations(),
        3,
        "each unknown namespace of a set is minted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_registrations_for_a_new_namespace_create_exactly_one_record() {
    const RACERS: usize = 16;
    let store = Arc::new(InMemoryNamespaceStore::new());
    let registry = registry_over(&store, NamespacePolicy::Open);
    let start = Arc::new(tokio::sync::Barrier::new(RACERS));

    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let registry = registry.clone();
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                admit(&registry, registration(&["rush"], "", "", &["charge"])).await
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for racer in racers {
        tokens.push(racer.await.unwrap().unwrap());
    }

    assert_eq!(registry.len(), RACERS, "every racer was admitted");
    assert_eq!(
        store.creations(),
        1,
        "racing registrations converge on one record"
    );
}

#[tokio::test]
async fn closed_policy_refuses_an_unknown_namespace_and_creates_nothing() {
    let store = Arc::new(InMemoryNamespaceStore::with_records([record(
        "known",
        Placement::Unplaced,
    )]));
    let registry = registry_over(&store, NamespacePolicy::Closed);

    let refusal = admit(
        &registry,
        registration(&["known", "ghost"], "", "", &["charge"]),
    )
    .await
    .unwrap_err();
    assert_eq!(
        refusal,
        AdmissionError::UnknownNamespace {
            namespace: "ghost".to_owned()
        }
    );
    assert_eq!(refusal.kind(), RefusalKind::NotFound);
    assert_eq!(store.creations(), 0);
    assert_eq!(store.get("ghost").await.unwrap(), None);
    assert!(
        registry.is_empty(),
        "the known namespace is not partially admitted"
    );

    let _token = admit(&registry, registration(&["known"], "", "", &["charge"]))
        .await
        .unwrap();
    assert_eq!(listed(&registry, "known", "", "charge", None).len(), 1);
}

#[tokio::test]
async fn a_registration_refused_after_the_policy_step_mints_nothing() {
    let store = Arc::new(InMemoryNamespaceStore::with_records([record(
        "iso",
        Placement::Pinned(nodes(&["n1"])),
    )]));
    let registry = registry_over(&store, NamespacePolicy::Open);

    let mut no_capacity = registration(&["fresh"], "", "", &["dev"]);
    no_capacity.max_concurrency = None;
    assert_eq!(
        admit(&registry, no_capacity).await.err(),
        Some(AdmissionError::MissingCapacity)
    );
    let misplaced = registration(&["fresh", "iso"], "", "n2", &["dev"]);
    assert!(matches!(
        admit(&registry, misplaced).await,
        Err(AdmissionError::PlacementViolated { .. })
    ));
    assert_eq!(
        store.creations(),
        0,
        "a refused registration creates no namespace"
    );

    let _token = admit(&registry, registration(&["fresh"], "", "", &["dev"]))
        .await
        .unwrap();
    assert_eq!(
        store.creations(),
        1,
        "control: the same namespace is minted on admission"
    );
}

#[tokio::test]
async fn pinned_placement_admits_only_workers_on_a_required_node() {
    let store = Arc::new(InMemoryNamespaceStore::with_records([record(
        "iso",
        Placement::Pinned(nodes(&["n1", "n3"])),
    )]));
    let registry = registry_over(&store, NamespacePolicy::Open);

    let _on_n1 = admit(&registry, registration(&["iso"], "", "n1", &["charge"]))
        .await
        .unwrap();
    assert_eq!(listed(&registry, "iso", "", "charge", Some("n1")).len(), 1);

    let wrong = admit(&registry, registration(&["iso"], "", "n2", &["charge"]))
        .await
        .unwrap_err();
    assert_eq!(
        wrong,
        AdmissionError::PlacementViolated {
            namespace: "iso".to_owned(),
            node: Node::new("n2"),
            required: nodes(&["n1", "n3"]).into_iter().collect(),
        }
    );
    assert_eq!(wrong.kind(), RefusalKind::Placement);
    assert_eq!(
        wrong.to_string(),
        "namespace \"iso\" is pinned to nodes [n1, n3] and the worker advertises node \"n2\""
    );

    let nodeless = admit(&registry, registration(&["iso"], "", "", &["charge"]))
        .await
        .unwrap_err();
    assert!(
        nodeless
            .to_string()
            .ends_with("the worker advertises no node"),
        "{nodeless}"
    );
    assert_eq!(registry.len(), 1, "neither refused worker was inserted");
}

#[tokio::test]
async fn a_pinned_violation_refuses_the_whole_multi_namespace_registration() {
    let store = Arc::new(InMemoryNamespaceStore::with_records([
        record("free", Placement::Unplaced),
        record("iso", Placement::Pinned(nodes(&["n1"]))),
    ]));
    let registry = registry_over(&store, NamespacePolicy::Open);

    let refusal = admit(
        &registry,
        registration(&["free", "iso"], "", "n2", &["charge"]),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(refusal, AdmissionError::PlacementViolated { ref namespace, .. } if namespace == "iso")
    );
    assert!(registry.is_empty());
    assert!(
        listed(&registry, "free", "", "charge", None).is_empty(),
        "no partial admit"
    );

    let _ok = admit(
        &registry,
        registration(&["free", "iso"], "", "n1", &["charge"]),
    )
    .await
    .unwrap();
    assert_eq!(listed(&registry, "free", "", "charge", None).len(), 1);
}

#[tokio::test]
async fn prefer_and_unplaced_namespaces_admit_node_less_workers() {
    let store = Arc::new(InMemoryNamespaceStore::with_records([
        record("unpl", Placement::Unplaced),
        record("pref", Placement::Prefer(nodes(&["n1"]))),
    ]));
    let registry = registry_over(&store, NamespacePolicy::Closed);
    let _a = admit(&registry, registration(&["unpl"], "", "", &["charge"]))
        .await
        .unwrap();
    let _b = admit(&registry, registration(&["pref"], "", "n9", &["charge"]))
        .await
        .unwrap();
    assert_eq!(listed(&registry, "unpl", "", "charge", None).len(), 1);
    assert_eq!(listed(&registry, "pref", "", "charge", None).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_repeated_identical_refusal_is_logged_once_per_window() {
    let registry = Registry::builder()
        .audit_window(Duration::from_secs(60))
        .build();
    let audit = registry.admission_audit();
    let mut zero = registration(&["ns"], "", "", &["dev"]);
    zero.max_concurrency = Some(0);

    for _ in 0..5 {
        assert!(admit(&registry, zero.clone()).await.is_err());
    }
    assert_eq!((audit.refusals(), audit.logged()), (5, 1));

    let mut other_reason = zero.clone();
    other_reason.max_concurrency = None;
    assert!(admit(&registry, other_reason).await.is_err());
    let mut other_identity = zero.clone();
    other_identity.identity = "another-worker".to_owned();
    assert!(admit(&registry, other_identity).await.is_err());
    assert_eq!(
        (audit.refusals(), audit.logged()),
        (7, 3),
        "a new reason or identity is logged"
    );

    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(admit(&registry, zero).await.is_err());
    assert_eq!(
        (audit.refusals(), audit.logged()),
        (8, 4),
        "logged again in the next window"
    );
}

#[tokio::test]
async fn a_gateway_shutting_down_admits_no_worker_and_says_come_back() {
    let registry = Registry::default();
    let before = admit(&registry, registration(&["ns"], "", "", &["dev"]))
        .await
        .expect("control: admitted before the shutdown");
    assert_eq!(
        registry.broadcast_shutdown(),
        1,
        "the registered worker is told"
    );
    let refusal = admit(&registry, registration(&["ns"], "", "", &["dev"]))
        .await
        .expect_err("refused during the shutdown");
    assert_eq!(refusal, AdmissionError::ShuttingDown);
    assert_eq!(refusal.kind(), RefusalKind::Unavailable);
    assert_eq!(
        refusal.to_string(),
        "the gateway is shutting down; register again once it is back"
    );
    assert!(
        registry.is_registered(before.id()),
        "the registered worker stays to finish"
    );
    assert_eq!(registry.len(), 1);
}

#[tokio::test]
async fn a_caller_without_the_worker_role_is_refused_naming_the_role() {
    use crate::role::Role;
    let registry = Registry::default();
    let producer = CallerIdentity::granted("p1", ["a"]).with_roles([Role::Producer]);
    let refusal = try_admit(&registry, &producer, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "principal `p1` lacks role `worker` to register a worker"
    );
    assert_eq!(refusal.kind(), RefusalKind::Unauthorised);
    assert!(registry.is_empty());

    // Control: the same principal with `worker` (or `admin`) registers.
    let mut admitted = Vec::new();
    for roles in [vec![Role::Worker, Role::Producer], vec![Role::Admin]] {
        let worker = CallerIdentity::granted("p1", ["a"]).with_roles(roles);
        admitted.push(
            try_admit(&registry, &worker, registration(&["a"], "", "", &["dev"]))
                .await
                .unwrap(),
        );
    }
    assert_eq!(registry.len(), 2);
}

#[tokio::test]
async fn a_principal_holds_at_most_max_workers_and_a_departure_frees_a_place() {
    let registry = Registry::default();
    let capped = CallerIdentity::granted("w1", ["a"]).with_max_workers(2);
    let first = try_admit(&registry, &capped, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap();
    let _second = try_admit(&registry, &capped, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap();
    let refusal = try_admit(&registry, &capped, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap_err();
    assert_eq!(
        refusal,
        AdmissionError::PrincipalWorkerLimit {
            principal: "w1".to_owned(),
            limit: 2
        }
    );
    assert_eq!(refusal.kind(), RefusalKind::Exhausted);
    assert!(
        refusal
            .to_string()
            .contains("`principals[].max_workers` (2)")
    );

    // Controls: another principal is not counted against w1, and a departure frees a place.
    let other = CallerIdentity::granted("w2", ["a"]).with_max_workers(2);
    let _theirs = try_admit(&registry, &other, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap();
    registry.deregister(
        first.token.worker_id(),
        crate::events::DisconnectReason::Timeout,
    );
    let _again = try_admit(&registry, &capped, registration(&["a"], "", "", &["dev"]))
        .await
        .unwrap();
    assert_eq!(registry.len(), 3);
}
