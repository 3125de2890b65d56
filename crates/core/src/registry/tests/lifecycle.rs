//! Leaving, draining, events and the liveness verdict watermark.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::address::{Node, WorkerId};
use crate::delivery::{TransportName, WorkerMessage};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::events::{DisconnectReason, WorkerEvent};
use crate::registry::Registry;
use crate::registry::testing::{
    CAPACITY, TestLeg, admit, admit_on, hold, listed, pick, registration,
};

/// Every event received so far, without waiting.
fn drain_events(events: &mut broadcast::Receiver<WorkerEvent>) -> Vec<WorkerEvent> {
    std::iter::from_fn(|| events.try_recv().ok())
        .take(64)
        .collect()
}

fn disconnections(events: &[WorkerEvent]) -> Vec<(WorkerId, DisconnectReason)> {
    events
        .iter()
        .filter_map(|event| match event {
            WorkerEvent::Disconnected { worker, reason } => Some((*worker, *reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn deregistration_is_idempotent_and_emits_one_disconnected_event() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let departures = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&departures);
    registry.observe_departures(Arc::new(move |worker, reason| {
        seen.lock().unwrap().push((worker, reason));
    }));
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.id();

    assert!(registry.deregister(id, DisconnectReason::Timeout));
    assert!(
        !registry.deregister(id, DisconnectReason::Timeout),
        "already gone"
    );
    assert!(
        !worker.token.deregister(DisconnectReason::Drained),
        "the token finds it gone"
    );
    assert!(!registry.is_registered(id));

    let events = drain_events(&mut events);
    assert_eq!(
        disconnections(&events),
        vec![(id, DisconnectReason::Timeout)]
    );
    assert_eq!(
        *departures.lock().unwrap(),
        vec![(id, DisconnectReason::Timeout)]
    );
}

#[test]
fn dropping_the_token_deregisters_as_a_disconnect() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let kept = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.id();
    let slot = hold(&registry, "ns", "", "dev").unwrap();
    assert_eq!(slot.worker(), id);

    drop(worker.token);
    assert!(!registry.is_registered(id));
    assert!(
        registry.is_registered(kept.id()),
        "only the dropped token's worker left"
    );
    drop(slot); // a reservation outliving its worker frees nothing and wakes nobody
    assert_eq!(
        disconnections(&drain_events(&mut events)),
        vec![(id, DisconnectReason::Disconnect)]
    );

    let explicit = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let explicit_id = explicit.id();
    assert!(explicit.token.deregister(DisconnectReason::Drained));
    assert_eq!(
        disconnections(&drain_events(&mut events)),
        vec![(explicit_id, DisconnectReason::Drained)],
        "the named reason, once, and no second event from the consumed token"
    );
}

#[test]
fn drain_fences_the_worker_before_asking_it_to_drain() {
    let registry = Registry::default();
    let mut draining = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let other = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = draining.id();
    assert!(listed(&registry, "ns", "", "dev", None).contains(&id));

    let standing_at_drain = Arc::new(Mutex::new(Vec::new()));
    let observed = Arc::clone(&standing_at_drain);
    let observer = registry.clone();
    draining.leg.on_deliver(move |message| {
        if *message == WorkerMessage::Drain {
            let standing = observer.worker(id).map(|w| w.eligibility);
            observed.lock().unwrap().push(standing);
        }
    });

    assert!(registry.drain_worker(id));
    assert_eq!(
        *standing_at_drain.lock().unwrap(),
        vec![Some(Eligibility::Draining)],
        "one drain request, sent after the worker was fenced"
    );
    assert_eq!(draining.rx.try_recv().unwrap(), WorkerMessage::Drain);
    assert!(draining.rx.try_recv().is_err(), "exactly one message");
    assert!(
        registry.is_registered(id),
        "a drained worker finishes its work before leaving"
    );
    for _ in 0..3 {
        assert_eq!(pick(&registry, "ns", "", "dev", None), Some(other.id()));
    }
}

#[test]
fn a_transport_without_a_drain_channel_is_deregistered_instead() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let mut worker = admit_on(
        &registry,
        registration(&["ns"], "", "", &["dev"]),
        TestLeg::drainless(),
    );
    let id = worker.id();

    assert!(registry.drain_worker(id));
    assert!(!registry.is_registered(id));
    assert!(
        worker.rx.try_recv().is_err(),
        "nothing was sent on a leg that cannot drain"
    );
    assert_eq!(
        disconnections(&drain_events(&mut events)),
        vec![(id, DisconnectReason::Drained)]
    );
}

#[test]
fn draining_a_closed_leg_deregisters_it_as_a_disconnect() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.id();
    drop(worker.rx);

    assert!(registry.drain_worker(id));
    assert!(!registry.is_registered(id));
    assert_eq!(
        disconnections(&drain_events(&mut events)),
        vec![(id, DisconnectReason::Disconnect)]
    );
    assert!(
        !registry.drain_worker(id),
        "an unknown worker is not drained"
    );
}

#[test]
fn broadcast_drain_drains_every_worker() {
    let registry = Registry::default();
    let mut a = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let mut b = admit(&registry, registration(&["other"], "q", "n1", &["ops"]));
    let c = admit_on(
        &registry,
        registration(&["ns"], "", "", &["dev"]),
        TestLeg::drainless(),
    );

    assert_eq!(registry.broadcast_drain(), 3);
    assert_eq!(a.rx.try_recv().unwrap(), WorkerMessage::Drain);
    assert_eq!(b.rx.try_recv().unwrap(), WorkerMessage::Drain);
    assert!(!registry.is_registered(c.id()));
    assert_eq!(pick(&registry, "ns", "", "dev", None), None);
    assert_eq!(pick(&registry, "other", "q", "ops", None), None);
    assert_eq!(registry.len(), 2, "drained workers stay until they leave");
}

#[test]
fn events_announce_connection_exclusion_recovery_and_capacity() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit_on(
        &registry,
        registration(&["a", "b"], "q", "n1", &["dev"]),
        TestLeg::announcing(),
    );
    let id = worker.id();
    registry.set_advertised_capacity(id, 5).unwrap();
    let lost = HashMap::from([(id, DispatchExclusion::ReachabilityLost)]);
    registry.set_dispatch_ineligible(lost.clone());
    registry.set_dispatch_ineligible(lost);
    registry.set_dispatch_ineligible(HashMap::new());
    registry.set_dispatch_ineligible(HashMap::new());

    assert_eq!(
        drain_events(&mut events),
        vec![
            WorkerEvent::Connected {
                worker: id,
                transport: TransportName::from_static("test"),
                namespaces: ["a".to_owned(), "b".to_owned()].into(),
                task_queue: "q".to_owned(),
                node: Node::new("n1"),
            },
            WorkerEvent::CapacityAnnounced {
                worker: id,
                capacity: 5
            },
            WorkerEvent::Excluded {
                worker: id,
                exclusion: DispatchExclusion::ReachabilityLost
            },
            WorkerEvent::Recovered { worker: id },
        ],
        "a repeated verdict changes nothing and emits nothing"
    );
}

#[test]
fn an_opening_probation_is_not_an_exclusion_and_its_end_is_not_a_recovery() {
    let registry = Registry::builder().opening_probation(true).build();
    let mut events = registry.subscribe_events();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.id();
    assert_eq!(pick(&registry, "ns", "", "dev", None), None, "on probation");

    registry.publish_verdicts(HashMap::new(), Some(id));
    assert_eq!(pick(&registry, "ns", "", "dev", None), Some(id));
    // Control: a real loss later is announced, and so is its recovery.
    registry.publish_verdicts(
        HashMap::from([(id, DispatchExclusion::ReachabilityLost)]),
        Some(id),
    );
    registry.publish_verdicts(HashMap::new(), Some(id));
    let kinds: Vec<_> = drain_events(&mut events)
        .into_iter()
        .map(|event| match event {
            WorkerEvent::Connected { .. } => "connected",
            WorkerEvent::CapacityAnnounced { .. } => "capacity",
            WorkerEvent::ProbationPassed { .. } => "probation passed",
            WorkerEvent::Excluded {
                exclusion: DispatchExclusion::OpeningProbation,
                ..
            } => "excluded: probation",
            WorkerEvent::Excluded { .. } => "excluded",
            WorkerEvent::Recovered { .. } => "recovered",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "connected",
            "capacity",
            "probation passed",
            "excluded",
            "recovered"
        ]
    );
}

#[test]
fn a_worker_lost_during_its_probation_is_announced_as_excluded() {
    let registry = Registry::builder().opening_probation(true).build();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let mut events = registry.subscribe_events();
    registry.publish_verdicts(
        HashMap::from([(worker.id(), DispatchExclusion::ReachabilityLost)]),
        Some(worker.id()),
    );
    assert_eq!(
        drain_events(&mut events),
        vec![WorkerEvent::Excluded {
            worker: worker.id(),
            exclusion: DispatchExclusion::ReachabilityLost
        }]
    );
}

#[test]
fn a_registration_carrying_capacity_announces_it_and_an_announcing_leg_waits() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let carried = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let announcing = admit_on(
        &registry,
        registration(&["ns"], "", "", &["dev"]),
        TestLeg::announcing(),
    );
    let capacities: Vec<_> = drain_events(&mut events)
        .into_iter()
        .filter_map(|event| match event {
            WorkerEvent::CapacityAnnounced { worker, capacity } => Some((worker, capacity)),
            _ => None,
        })
        .collect();
    assert_eq!(
        capacities,
        vec![(carried.id(), CAPACITY)],
        "control: the announcing worker has stated nothing yet"
    );
    registry
        .set_advertised_capacity(announcing.id(), 3)
        .unwrap();
    assert_eq!(
        drain_events(&mut events),
        vec![WorkerEvent::CapacityAnnounced {
            worker: announcing.id(),
            capacity: 3
        }]
    );
}

#[test]
fn a_verdict_from_before_a_worker_arrived_keeps_its_probation() {
    let registry = Registry::builder().opening_probation(true).build();
    let known = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let newer = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    assert_eq!(
        pick(&registry, "ns", "", "dev", None),
        None,
        "both start on probation"
    );

    // The prober knew only `known`; its verdict cannot speak for `newer`, in either direction.
    registry.publish_verdicts(
        HashMap::from([(newer.id(), DispatchExclusion::ReachabilityLost)]),
        Some(known.id()),
    );
    assert_eq!(listed(&registry, "ns", "", "dev", None), vec![known.id()]);
    assert_eq!(
        registry.dispatch_exclusions(),
        HashMap::from([(newer.id(), DispatchExclusion::OpeningProbation)])
    );

    // Control: a verdict whose view includes `newer` does lift it.
    registry.publish_verdicts(HashMap::new(), Some(newer.id()));
    assert_eq!(listed(&registry, "ns", "", "dev", None).len(), 2);
    assert!(registry.dispatch_exclusions().is_empty());
}

#[test]
fn a_verdict_for_a_departed_worker_is_dropped() {
    let registry = Registry::default();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.id();
    drop(worker);
    registry.set_dispatch_ineligible(HashMap::from([(id, DispatchExclusion::ReachabilityLost)]));
    assert!(registry.dispatch_exclusions().is_empty());
}

#[test]
fn registries_with_two_node_numbers_never_mint_the_same_worker_id() {
    use crate::registry::NodeNumber;
    let one = NodeNumber::new(1).unwrap();
    let two = NodeNumber::new(2).unwrap();
    let a = Registry::builder().node_number(one).build();
    let b = Registry::builder().build();
    assert_eq!(b.node_number(), NodeNumber::NONE, "the default is 0");
    assert!(b.set_node_number(two), "a number set after the build");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..4 {
        for (registry, number) in [(&a, one), (&b, two)] {
            let worker = admit(registry, registration(&["ns"], "", "", &["dev"]));
            assert_eq!(NodeNumber::of(worker.id()), number, "{}", worker.id());
            assert!(seen.insert(worker.id()), "{} minted twice", worker.id());
        }
    }
    // Control: without a number, ids are the plain counter (number 0), as before.
    let plain = Registry::default();
    let worker = admit(&plain, registration(&["ns"], "", "", &["dev"]));
    assert_eq!(NodeNumber::of(worker.id()), NodeNumber::NONE);
    assert!(worker.id().get() < 1 << crate::registry::WORKER_ID_NODE_SHIFT);
}

#[test]
fn the_node_number_only_rises_so_ids_keep_rising() {
    use crate::registry::NodeNumber;
    let registry = Registry::builder()
        .node_number(NodeNumber::new(3).unwrap())
        .build();
    let before = admit(&registry, registration(&["ns"], "", "", &["dev"])).id();
    assert!(
        !registry.set_node_number(NodeNumber::new(2).unwrap()),
        "a lower number is refused"
    );
    assert_eq!(registry.node_number(), NodeNumber::new(3).unwrap());
    assert!(registry.set_node_number(NodeNumber::new(4).unwrap()));
    let after = admit(&registry, registration(&["ns"], "", "", &["dev"])).id();
    assert!(after > before, "{after} after {before}");
    assert_eq!(NodeNumber::of(after), NodeNumber::new(4).unwrap());
}
