//! The pool census, its classification, and the age of the last departure.

use std::collections::HashMap;
use std::time::Duration;

use crate::eligibility::DispatchExclusion;
use crate::registry::testing::{TestLeg, admit, admit_on, hold, registration};
use crate::registry::{PoolCensus, Registry, UnservedReason};

#[test]
fn a_never_served_address_has_an_empty_census_and_no_departure_age() {
    let registry = Registry::default();
    let census = registry.pool_census("default", "general", "greet", None);
    assert_eq!(census, PoolCensus::default());
    assert_eq!(census.classify(), Some(UnservedReason::NoWorkers));
    let sentence = census.describe().unwrap();
    assert!(
        sentence.contains("no compatible worker has been seen"),
        "{sentence}"
    );
}

#[test]
fn the_census_separates_pool_activity_and_compatible_workers() {
    let registry = Registry::default();
    let _greeter = admit(
        &registry,
        registration(&["default"], "general", "n1", &["greet"]),
    );
    // Two activities, one head in the pool.
    let _settler = admit(
        &registry,
        registration(&["default"], "general", "n1", &["settle", "ship"]),
    );

    let served = registry.pool_census("default", "general", "greet", None);
    assert_eq!(
        (
            served.pool_workers,
            served.activity_workers,
            served.compatible,
            served.eligible
        ),
        (2, 1, 1, 1)
    );
    assert_eq!(served.classify(), None);
    assert_eq!(served.describe(), None);

    let other_activity = registry.pool_census("default", "general", "audit", None);
    assert_eq!(
        (
            other_activity.pool_workers,
            other_activity.activity_workers,
            other_activity.compatible
        ),
        (2, 0, 0)
    );
    assert_eq!(
        other_activity.classify(),
        Some(UnservedReason::WorkersIncompatible)
    );

    let wrong_node = registry.pool_census("default", "general", "greet", Some("n2"));
    assert_eq!(
        (
            wrong_node.pool_workers,
            wrong_node.activity_workers,
            wrong_node.compatible
        ),
        (2, 1, 0)
    );
    assert_eq!(
        wrong_node.last_compatible_departure, None,
        "never served on n2"
    );
    assert_eq!(
        wrong_node.classify(),
        Some(UnservedReason::WorkersIncompatible)
    );

    let pinned = registry.pool_census("default", "general", "greet", Some("n1"));
    assert_eq!((pinned.compatible, pinned.eligible), (1, 1));
}

#[test]
fn each_compatible_worker_is_counted_under_exactly_one_standing() {
    let registry = Registry::default();
    let reg = || registration(&["ns"], "", "", &["dev"]);
    let mut one = reg();
    one.max_concurrency = Some(1);
    let full = admit(&registry, one);
    let _slot = hold(&registry, "ns", "", "dev").unwrap();
    let _eligible = admit(&registry, reg());
    let _unannounced = admit_on(&registry, reg(), TestLeg::announcing());
    let probation = admit(&registry, reg());
    let lost = admit(&registry, reg());
    let draining = admit(&registry, reg());
    let gone = admit(&registry, reg());
    registry.set_dispatch_ineligible(HashMap::from([
        (probation.id(), DispatchExclusion::OpeningProbation),
        (lost.id(), DispatchExclusion::ReachabilityLost),
    ]));
    assert!(registry.drain_worker(draining.id()));
    gone.leg.set_connected(false);

    let census = registry.pool_census("ns", "", "dev", None);
    assert_eq!(census.compatible, 7);
    assert_eq!(
        [
            census.eligible,
            census.at_capacity,
            census.capacity_unannounced,
            census.on_probation,
            census.reachability_lost,
            census.draining,
            census.disconnected,
        ],
        [1; 7]
    );
    assert_eq!(registry.worker(full.id()).unwrap().in_flight, 1);
}

/// Builds a one-worker pool in the given condition and returns its census.
fn census_of(condition: &str) -> PoolCensus {
    let registry = Registry::default();
    let reg = || registration(&["ns"], "", "n1", &["dev"]);
    let worker = match condition {
        "unannounced" => admit_on(&registry, reg(), TestLeg::announcing()),
        _ => admit(&registry, reg()),
    };
    let mut held = Vec::new();
    match condition {
        "eligible" | "unannounced" => {}
        "full" => held.extend(std::iter::from_fn(|| hold(&registry, "ns", "", "dev")).take(8)),
        "probation" | "lost" => {
            let exclusion = if condition == "lost" {
                DispatchExclusion::ReachabilityLost
            } else {
                DispatchExclusion::OpeningProbation
            };
            registry.set_dispatch_ineligible(HashMap::from([(worker.id(), exclusion)]));
        }
        "draining" => assert!(registry.drain_worker(worker.id())),
        other => unreachable!("unknown condition {other}"),
    }
    registry.pool_census("ns", "", "dev", None)
}

#[test]
fn classify_names_the_one_reason_a_dispatch_waits() {
    assert_eq!(census_of("eligible").classify(), None);
    let cases = [
        ("full", UnservedReason::AllAtCapacity, "at capacity"),
        (
            "unannounced",
            UnservedReason::CapacityUnannounced,
            "not announced",
        ),
        ("probation", UnservedReason::OnProbation, "probation"),
        ("lost", UnservedReason::WorkersUnreachable, "unreachable"),
        ("draining", UnservedReason::Draining, "draining"),
    ];
    for (condition, reason, words) in cases {
        let census = census_of(condition);
        assert_eq!(census.classify(), Some(reason), "{condition}");
        let sentence = census.describe().unwrap();
        assert!(sentence.starts_with(reason.as_str()), "{sentence}");
        assert!(sentence.contains(words), "{condition}: {sentence}");
        assert_eq!(reason.is_transient(), condition == "probation");
    }

    let registry = Registry::default();
    assert_eq!(
        registry.pool_census("ns", "", "dev", None).classify(),
        Some(UnservedReason::NoWorkers)
    );
    let _other = admit(&registry, registration(&["ns"], "", "", &["ops"]));
    assert_eq!(
        registry.pool_census("ns", "", "dev", None).classify(),
        Some(UnservedReason::WorkersIncompatible)
    );
}

#[test]
fn a_lost_worker_outranks_busy_ones_only_when_every_worker_is_lost() {
    let mixed = PoolCensus {
        pool_workers: 2,
        activity_workers: 2,
        compatible: 2,
        at_capacity: 1,
        reachability_lost: 1,
        ..PoolCensus::default()
    };
    assert_eq!(mixed.classify(), Some(UnservedReason::AllAtCapacity));
    let all_lost = PoolCensus {
        at_capacity: 0,
        reachability_lost: 2,
        ..mixed
    };
    assert_eq!(
        all_lost.classify(),
        Some(UnservedReason::WorkersUnreachable)
    );
}

#[tokio::test(start_paused = true)]
async fn the_departure_age_counts_from_the_last_compatible_worker_and_clears_on_return() {
    let registry = Registry::default();
    let reg = || registration(&["default"], "general", "n1", &["greet"]);
    let first = admit(&registry, reg());
    let second = admit(&registry, reg());
    let age = |node: Option<&str>| {
        registry
            .pool_census("default", "general", "greet", node)
            .last_compatible_departure
    };

    drop(first.token);
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(age(None), None, "a compatible worker remains");

    drop(second.token);
    assert_eq!(
        registry
            .pool_census("default", "general", "greet", None)
            .pool_workers,
        0,
        "the pool's head count follows departures"
    );
    tokio::time::advance(Duration::from_secs(7)).await;
    assert_eq!(
        age(None),
        Some(Duration::from_secs(7)),
        "from the last departure, not the first"
    );
    assert_eq!(age(Some("n1")), Some(Duration::from_secs(7)));
    assert_eq!(age(Some("n2")), None, "never served on n2");
    let sentence = registry
        .pool_census("default", "general", "greet", None)
        .describe()
        .unwrap();
    assert!(sentence.contains("left 7s ago"), "{sentence}");

    let back = admit(&registry, reg());
    assert_eq!(age(None), None, "served again");
    assert!(
        registry.inner.lock().departures.is_empty(),
        "the record is cleared on return"
    );

    drop(back.token);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(age(None), Some(Duration::from_secs(2)));
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_worker_is_suspended_says_so_with_the_grace_left() {
    let registry = Registry::default();
    let mut with_session = registration(&["default"], "general", "", &["greet"]);
    with_session.reconnect_grace = Duration::from_secs(15);
    let worker = admit(&registry, with_session);
    let id = worker.id();
    assert!(worker.token.session().is_some(), "a grace gives a session");
    // The connection is lost: the transport ends the registration as a disconnect.
    drop(worker);
    tokio::time::advance(Duration::from_secs(5)).await;
    let census = registry.pool_census("default", "general", "greet", None);
    assert_eq!(
        (census.suspended, census.eligible, census.disconnected),
        (1, 0, 0)
    );
    assert_eq!(census.suspended_grace_left, Some(Duration::from_secs(10)));
    assert_eq!(census.classify(), Some(UnservedReason::WorkersSuspended));
    assert!(UnservedReason::WorkersSuspended.is_transient());
    let sentence = census.describe().unwrap();
    assert!(
        sentence.starts_with("workers_suspended: 1 compatible worker(s) lost their connection and may resume within 10s"),
        "{sentence}"
    );
    let listed = registry.worker(id).unwrap();
    assert_eq!(listed.eligibility, crate::Eligibility::Suspended);
    assert_eq!(listed.suspended_for, Some(Duration::from_secs(10)));

    // Control: the same loss without a session leaves the pool at once.
    let plain = admit(
        &registry,
        registration(&["default"], "other", "", &["greet"]),
    );
    drop(plain);
    let census = registry.pool_census("default", "other", "greet", None);
    assert_eq!((census.pool_workers, census.suspended), (0, 0));
    assert_eq!(census.classify(), Some(UnservedReason::NoWorkers));
}

#[tokio::test(start_paused = true)]
async fn a_silent_session_worker_is_suspended_and_its_connection_told_to_close() {
    let registry = Registry::default();
    let mut with_session = registration(&["default"], "general", "", &["greet"]);
    with_session.reconnect_grace = Duration::from_secs(15);
    let worker = admit(&registry, with_session);
    let id = worker.id();
    let departure = worker.token.departure();
    // The liveness prober's verdict on a worker silent for its whole window.
    assert!(registry.deregister(id, crate::DisconnectReason::Timeout));
    assert!(registry.is_registered(id), "suspended, not removed");
    assert_eq!(
        registry.worker(id).unwrap().eligibility,
        crate::Eligibility::Suspended
    );
    assert_eq!(
        departure.reason(),
        Some(crate::DisconnectReason::Timeout),
        "the transport is told to close the silent connection"
    );
    // A second silence verdict changes nothing; the grace decides.
    assert!(!registry.deregister(id, crate::DisconnectReason::Timeout));
    // Let the grace timer start, then let the grace pass.
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(15)).await;
    tokio::task::yield_now().await;
    assert!(!registry.is_registered(id), "the grace ended it");

    // Control: a silent worker without a session leaves at once.
    let plain = admit(
        &registry,
        registration(&["default"], "general", "", &["greet"]),
    );
    assert!(registry.deregister(plain.id(), crate::DisconnectReason::Timeout));
    assert!(!registry.is_registered(plain.id()));
}

#[tokio::test(start_paused = true)]
async fn draining_a_suspended_worker_lets_it_go_as_drained() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let mut with_session = registration(&["default"], "general", "", &["greet"]);
    with_session.reconnect_grace = Duration::from_secs(15);
    let worker = admit(&registry, with_session);
    let id = worker.id();
    drop(worker);
    assert!(registry.is_registered(id), "suspended");
    assert!(registry.drain_worker(id));
    assert!(
        !registry.is_registered(id),
        "a drain is final: the session ends"
    );
    let reasons: Vec<crate::DisconnectReason> = std::iter::from_fn(|| events.try_recv().ok())
        .filter_map(|event| match event {
            crate::WorkerEvent::Disconnected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    // Control: the reason names the drain, not a lost connection.
    assert_eq!(reasons, vec![crate::DisconnectReason::Drained]);
}

/// The cheap question the dispatcher asks before it parks agrees with the census's
/// `compatible` count: the activity and node must match, the standing does not.
#[test]
fn has_compatible_workers_answers_as_the_census_counts_compatible_workers() {
    let registry = Registry::default();
    let asks = [
        ("greet", None),
        ("greet", Some("n1")),
        ("greet", Some("n2")),
        ("audit", None),
    ];
    let agree = |registry: &Registry| {
        asks.map(|(activity, node)| {
            let census = registry.pool_census("default", "general", activity, node);
            let has = registry.has_compatible_workers("default", "general", activity, node);
            assert_eq!(has, census.compatible > 0, "{activity} on {node:?}");
            has
        })
    };
    // Control: nobody is registered, so nothing is compatible.
    assert_eq!(agree(&registry), [false; 4]);
    let _greeter = admit(
        &registry,
        registration(&["default"], "general", "n1", &["greet"]),
    );
    assert_eq!(agree(&registry), [true, true, false, false]);
    // A worker running a task is as compatible as an idle one.
    let held = hold(&registry, "default", "general", "greet");
    assert!(held.is_some());
    assert_eq!(agree(&registry), [true, true, false, false]);
}
