//! Bounded state under worker churn: idle namespaces expire, and live ones are capped.

use std::sync::Arc;
use std::time::Duration;

use crate::admission::AdmissionError;
use crate::namespace::{InMemoryNamespaceStore, NamespaceRecord, Placement};
use crate::registration::CallerIdentity;
use crate::registry::Registry;
use crate::registry::testing::{registration, try_admit};

fn caller() -> CallerIdentity {
    CallerIdentity::trusted("tester")
}

#[tokio::test(start_paused = true)]
async fn a_registration_into_a_new_namespace_past_the_cap_is_refused_naming_the_key() {
    let registry = Registry::builder().max_namespaces(2).build();
    let a = try_admit(&registry, &caller(), registration(&["a"], "", "", &["w"]))
        .await
        .expect("room for a");
    let _b = try_admit(&registry, &caller(), registration(&["b"], "", "", &["w"]))
        .await
        .expect("room for b");
    let refused = try_admit(&registry, &caller(), registration(&["c"], "", "", &["w"]))
        .await
        .expect_err("a third live namespace");
    assert_eq!(refused, AdmissionError::NamespaceLimit { limit: 2 });
    assert!(
        refused
            .to_string()
            .contains("`registry.max_namespaces` (2)")
    );
    // A namespace already live takes no room.
    let _b2 = try_admit(&registry, &caller(), registration(&["b"], "", "", &["w"]))
        .await
        .expect("b is listed");

    // Control: once a's worker left, its idle namespace makes room for c.
    drop(a);
    let _c = try_admit(&registry, &caller(), registration(&["c"], "", "", &["w"]))
        .await
        .expect("a's idle namespace made room");
    assert_eq!(registry.namespaces_listed(), 2);
}

#[tokio::test(start_paused = true)]
async fn idle_namespaces_leave_the_series_and_the_store_after_the_expiry() {
    let known = NamespaceRecord {
        name: "known".to_owned(),
        placement: Placement::Unplaced,
    };
    let store = Arc::new(InMemoryNamespaceStore::with_records([known]));
    let registry = Registry::builder()
        .namespace_store(store.clone())
        .namespace_idle_expiry(Duration::from_secs(600))
        .build();
    let names: Vec<String> = (0..64).map(|i| format!("churn-{i}")).collect();
    for name in &names {
        let worker = try_admit(
            &registry,
            &caller(),
            registration(&[name, "known"], "", "", &["w"]),
        )
        .await
        .expect("admitted");
        drop(worker);
    }
    assert_eq!(store.len(), 65, "64 minted and the configured one");

    // Control: inside the expiry the namespaces still read, at 0.
    tokio::time::advance(Duration::from_secs(599)).await;
    let series = registry.namespace_series(tokio::time::Instant::now());
    assert_eq!(series.len(), 65);
    assert!(series.iter().all(|s| s.workers == 0));

    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        registry
            .namespace_series(tokio::time::Instant::now())
            .is_empty()
    );
    // The next registration sweeps the ledger and the minted records.
    let _next = try_admit(
        &registry,
        &caller(),
        registration(&["next"], "", "", &["w"]),
    )
    .await
    .expect("admitted");
    assert_eq!(registry.namespaces_listed(), 1);
    assert_eq!(
        store.len(),
        2,
        "the configured record stays; the minted ones went"
    );
}
