//! Advertised capacity: required, never zero, announced later on some transports, never exceeded.

use std::task::Poll;

use crate::admission::{AdmissionError, RefusalKind};
use crate::events::WorkerEvent;
use crate::registration::CallerIdentity;
use crate::registry::Registry;
use crate::registry::testing::{TestLeg, admit, admit_on, hold, pick, poll_once, registration};

#[tokio::test]
async fn a_registration_without_capacity_is_refused_by_name() {
    let registry = Registry::default();
    let mut missing = registration(&["ns"], "", "", &["charge"]);
    missing.max_concurrency = None;
    let (leg, _rx) = TestLeg::new();
    let caller = CallerIdentity::trusted("tester");

    let refusal = registry
        .admit(&caller, missing.clone(), leg.clone())
        .await
        .unwrap_err();
    assert_eq!(refusal, AdmissionError::MissingCapacity);
    assert_eq!(refusal.kind(), RefusalKind::Invalid);
    assert!(refusal.to_string().contains("max_concurrency"), "{refusal}");
    assert!(
        registry.is_empty(),
        "a refused registration leaves nothing behind"
    );

    missing.max_concurrency = Some(1);
    let _token = registry.admit(&caller, missing, leg).await.unwrap();
    assert_eq!(
        registry.len(),
        1,
        "the same registration with capacity is admitted"
    );
}

#[tokio::test]
async fn zero_capacity_is_refused_at_registration_and_on_announcement() {
    let registry = Registry::default();
    let caller = CallerIdentity::trusted("tester");
    let mut zero = registration(&["ns"], "", "", &["charge"]);
    zero.max_concurrency = Some(0);
    let (leg, _rx) = TestLeg::new();
    let refusal = registry.admit(&caller, zero, leg).await.unwrap_err();
    assert_eq!(refusal, AdmissionError::ZeroCapacity);
    assert!(
        refusal.to_string().contains("max_concurrency 0"),
        "{refusal}"
    );
    assert!(registry.is_empty());

    let pending = admit_on(
        &registry,
        registration(&["ns"], "", "", &["charge"]),
        TestLeg::announcing(),
    );
    let refusal = registry
        .set_advertised_capacity(pending.id(), 0)
        .unwrap_err();
    assert!(
        refusal.to_string().contains("max_concurrency 0"),
        "{refusal}"
    );
    assert_eq!(
        registry.worker(pending.id()).unwrap().capacity,
        None,
        "zero is not applied"
    );
    assert_eq!(pick(&registry, "ns", "", "charge", None), None);
    assert_eq!(
        registry.admission_audit().refusals(),
        2,
        "both refusals are audited"
    );

    registry.set_advertised_capacity(pending.id(), 1).unwrap();
    assert_eq!(
        pick(&registry, "ns", "", "charge", None),
        Some(pending.id())
    );
}

#[test]
fn a_worker_at_capacity_is_skipped_until_a_slot_frees() {
    let registry = Registry::default();
    let mut two = registration(&["ns"], "", "", &["charge"]);
    two.max_concurrency = Some(2);
    let worker = admit(&registry, two);

    let first = hold(&registry, "ns", "", "charge").unwrap();
    let second = hold(&registry, "ns", "", "charge").unwrap();
    assert_eq!(registry.worker(worker.id()).unwrap().in_flight, 2);
    assert!(
        hold(&registry, "ns", "", "charge").is_none(),
        "no third slot"
    );

    let census = registry.pool_census("ns", "", "charge", None);
    assert_eq!(
        (census.compatible, census.at_capacity, census.eligible),
        (1, 1, 0)
    );

    drop(first);
    assert_eq!(pick(&registry, "ns", "", "charge", None), Some(worker.id()));
    drop(second);
    assert_eq!(registry.worker(worker.id()).unwrap().in_flight, 0);
}

#[test]
fn unannounced_capacity_is_unselectable_until_announced_and_the_announcement_wakes() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit_on(
        &registry,
        registration(&["ns"], "", "", &["charge"]),
        TestLeg::announcing(),
    );

    let census = registry.pool_census("ns", "", "charge", None);
    assert_eq!(census.compatible, 1, "registered, not absent");
    assert_eq!(census.capacity_unannounced, 1);
    assert_eq!(census.at_capacity, 0, "idle and mute is not busy");
    assert_eq!(census.eligible, 0);
    assert_eq!(registry.worker(worker.id()).unwrap().capacity, None);
    assert_eq!(pick(&registry, "ns", "", "charge", None), None);
    assert!(registry.workers_for("ns", "", "charge", None).is_empty());

    let mut arrival = registry.worker_arrival();
    assert_eq!(poll_once(&mut arrival), Poll::Pending);
    registry.set_advertised_capacity(worker.id(), 2).unwrap();
    assert_eq!(
        poll_once(&mut arrival),
        Poll::Ready(()),
        "the announcement wakes"
    );

    assert!(matches!(
        events.try_recv(),
        Ok(WorkerEvent::Connected { .. })
    ));
    assert_eq!(
        events.try_recv().unwrap(),
        WorkerEvent::CapacityAnnounced {
            worker: worker.id(),
            capacity: 2
        }
    );

    // The announced number is what selection counts against.
    let _one = hold(&registry, "ns", "", "charge").unwrap();
    let _two = hold(&registry, "ns", "", "charge").unwrap();
    assert!(hold(&registry, "ns", "", "charge").is_none());
}

#[test]
fn announcing_for_an_unknown_worker_is_refused() {
    let registry = Registry::default();
    let worker = admit_on(
        &registry,
        registration(&["ns"], "", "", &["charge"]),
        TestLeg::announcing(),
    );
    let id = worker.id();
    drop(worker);
    assert_eq!(
        registry.set_advertised_capacity(id, 3),
        Err(AdmissionError::UnknownWorker)
    );
}

#[test]
fn a_freed_slot_wakes_a_parked_selection() {
    let registry = Registry::default();
    let mut one = registration(&["ns"], "", "", &["charge"]);
    one.max_concurrency = Some(1);
    let _worker = admit(&registry, one);
    let slot = hold(&registry, "ns", "", "charge").unwrap();

    let mut arrival = registry.worker_arrival();
    assert_eq!(poll_once(&mut arrival), Poll::Pending);
    drop(slot);
    assert_eq!(poll_once(&mut arrival), Poll::Ready(()));
}

#[test]
fn a_release_that_reopens_nothing_does_not_wake() {
    let registry = Registry::default();
    let _worker = admit(&registry, registration(&["ns"], "", "", &["charge"]));
    let first = hold(&registry, "ns", "", "charge").unwrap();
    let second = hold(&registry, "ns", "", "charge").unwrap();

    let mut arrival = registry.worker_arrival();
    drop(first);
    assert_eq!(
        poll_once(&mut arrival),
        Poll::Pending,
        "the worker had free slots all along; nobody parked on it"
    );
    drop(second);
    assert_eq!(poll_once(&mut arrival), Poll::Pending);
}

#[test]
fn shrinking_capacity_below_in_flight_blocks_selection_and_cancels_nothing() {
    let registry = Registry::default();
    let mut worker = admit_on(
        &registry,
        registration(&["ns"], "", "", &["charge"]),
        TestLeg::announcing(),
    );
    registry.set_advertised_capacity(worker.id(), 3).unwrap();
    let a = hold(&registry, "ns", "", "charge").unwrap();
    let b = hold(&registry, "ns", "", "charge").unwrap();

    registry.set_advertised_capacity(worker.id(), 1).unwrap();
    assert_eq!(registry.worker(worker.id()).unwrap().in_flight, 2);
    assert!(hold(&registry, "ns", "", "charge").is_none());
    assert!(
        worker.rx.try_recv().is_err(),
        "no message was sent to the worker"
    );

    drop((a, b));
    assert_eq!(pick(&registry, "ns", "", "charge", None), Some(worker.id()));
}

#[test]
fn a_reservation_outliving_its_worker_frees_nothing_on_the_slot_successor() {
    let registry = Registry::default();
    let mut one = registration(&["ns"], "", "", &["charge"]);
    one.max_concurrency = Some(1);
    let old = admit(&registry, one.clone());
    let old_slot = registry.inner.lock().workers.slot(old.id());
    let stale = hold(&registry, "ns", "", "charge").unwrap();
    drop(old.token);

    let new = admit(&registry, one);
    assert_eq!(
        registry.inner.lock().workers.slot(new.id()),
        old_slot,
        "the slot is reused"
    );
    let _held = hold(&registry, "ns", "", "charge").unwrap();
    drop(stale);
    assert_eq!(registry.worker(new.id()).unwrap().in_flight, 1);
    assert!(
        hold(&registry, "ns", "", "charge").is_none(),
        "the successor is still full"
    );
}

#[tokio::test]
async fn the_ceiling_admits_a_registration_at_it_and_refuses_one_above_it() {
    let registry = Registry::builder().max_concurrency_limit(8).build();
    assert_eq!(registry.max_concurrency_limit(), 8);
    let caller = CallerIdentity::trusted("tester");
    let mut above = registration(&["ns"], "", "", &["charge"]);
    above.max_concurrency = Some(9);
    let (leg, _rx) = TestLeg::new();

    let refusal = registry
        .admit(&caller, above.clone(), leg.clone())
        .await
        .unwrap_err();
    assert_eq!(
        refusal,
        AdmissionError::CapacityAboveLimit {
            max_concurrency: 9,
            limit: 8
        }
    );
    assert_eq!(refusal.kind(), RefusalKind::Invalid);
    assert_eq!(
        refusal.to_string(),
        "max_concurrency 9 exceeds this gateway's limit of 8"
    );
    assert!(registry.is_empty(), "a refused registration leaves nothing");
    assert_eq!(registry.admission_audit().refusals(), 1);

    above.max_concurrency = Some(8);
    let token = registry.admit(&caller, above, leg).await.unwrap();
    assert_eq!(
        registry.worker(token.worker_id()).unwrap().capacity,
        Some(8),
        "at the ceiling is admitted"
    );
}

#[test]
fn the_ceiling_applies_to_announcements_with_the_same_sentence() {
    let registry = Registry::builder().max_concurrency_limit(8).build();
    let announcing = admit_on(
        &registry,
        registration(&["ns"], "", "", &["charge"]),
        TestLeg::announcing(),
    );
    let worker = announcing.id();
    let above = AdmissionError::CapacityAboveLimit {
        max_concurrency: 9,
        limit: 8,
    };

    assert_eq!(
        registry.check_announced_capacity(worker, 9),
        Err(above.clone())
    );
    assert_eq!(registry.set_pending_capacity(worker, 9), Err(above.clone()));
    assert_eq!(registry.set_advertised_capacity(worker, 9), Err(above));
    let snapshot = registry.worker(worker).unwrap();
    assert_eq!(
        snapshot.capacity, None,
        "a refused announcement is not applied"
    );
    assert_eq!(pick(&registry, "ns", "", "charge", None), None);
    assert_eq!(
        registry.admission_audit().refusals(),
        3,
        "every refusal is audited"
    );

    assert_eq!(
        registry
            .check_announced_capacity(worker, 8)
            .map(|c| c.get()),
        Ok(8)
    );
    registry.set_pending_capacity(worker, 8).unwrap();
    registry.set_advertised_capacity(worker, 8).unwrap();
    assert_eq!(registry.worker(worker).unwrap().capacity, Some(8));
    assert_eq!(pick(&registry, "ns", "", "charge", None), Some(worker));
}

#[tokio::test]
async fn the_default_ceiling_refuses_the_largest_u32() {
    let registry = Registry::default();
    assert_eq!(
        registry.max_concurrency_limit(),
        crate::DEFAULT_MAX_CONCURRENCY_LIMIT
    );
    let mut huge = registration(&["ns"], "", "", &["charge"]);
    huge.max_concurrency = Some(u32::MAX);
    let (leg, _rx) = TestLeg::new();
    let refusal = registry
        .admit(&CallerIdentity::trusted("tester"), huge, leg)
        .await
        .unwrap_err();
    assert_eq!(
        refusal,
        AdmissionError::CapacityAboveLimit {
            max_concurrency: u32::MAX,
            limit: 1024
        }
    );
}
