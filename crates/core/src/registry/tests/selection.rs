//! Who selection reaches: namespaces, task queues, nodes, rotation order, eligibility, races.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Barrier};

use crate::address::WorkerId;
use crate::eligibility::DispatchExclusion;
use crate::registry::Registry;
use crate::registry::testing::{TestLeg, admit, admit_on, hold, listed, pick, registration};

#[test]
fn namespaces_are_isolated_on_register_and_deregister() {
    let registry = Registry::default();
    let a = admit(&registry, registration(&["tenant-a"], "", "", &["charge"]));
    let b = admit(&registry, registration(&["tenant-b"], "", "", &["charge"]));

    assert_eq!(
        listed(&registry, "tenant-a", "", "charge", None),
        vec![a.id()]
    );
    assert_eq!(
        listed(&registry, "tenant-b", "", "charge", None),
        vec![b.id()]
    );
    for _ in 0..3 {
        assert_eq!(
            pick(&registry, "tenant-a", "", "charge", None),
            Some(a.id())
        );
        assert_eq!(
            pick(&registry, "tenant-b", "", "charge", None),
            Some(b.id())
        );
    }
    assert!(listed(&registry, "tenant-a", "", "missing", None).is_empty());

    drop(a.token);
    assert!(listed(&registry, "tenant-a", "", "charge", None).is_empty());
    assert_eq!(pick(&registry, "tenant-a", "", "charge", None), None);
    assert_eq!(
        listed(&registry, "tenant-b", "", "charge", None),
        vec![b.id()],
        "deregistering in one namespace leaves the other untouched"
    );
}

#[test]
fn task_queues_partition_one_namespace_into_disjoint_pools() {
    let registry = Registry::default();
    let norn = admit(&registry, registration(&["local"], "norn", "", &["dev"]));
    let claude_1 = admit(&registry, registration(&["local"], "claude", "", &["dev"]));
    let claude_2 = admit(&registry, registration(&["local"], "claude", "", &["dev"]));
    let default_queue = admit(&registry, registration(&["local"], "", "", &["dev"]));

    assert_eq!(
        listed(&registry, "local", "norn", "dev", None),
        vec![norn.id()]
    );
    let claude: BTreeSet<WorkerId> = listed(&registry, "local", "claude", "dev", None)
        .into_iter()
        .collect();
    assert_eq!(claude, BTreeSet::from([claude_1.id(), claude_2.id()]));

    // Each queue rotates on its own cursor: claude alternates while norn keeps its one worker.
    let mut claude_turns = Vec::new();
    for _ in 0..4 {
        claude_turns.push(pick(&registry, "local", "claude", "dev", None));
        assert_eq!(
            pick(&registry, "local", "norn", "dev", None),
            Some(norn.id())
        );
    }
    let c1 = Some(claude_1.id());
    let c2 = Some(claude_2.id());
    assert_eq!(claude_turns[0], claude_turns[2]);
    assert_eq!(claude_turns[1], claude_turns[3]);
    assert_ne!(claude_turns[0], claude_turns[1]);
    assert!(claude_turns.iter().all(|turn| *turn == c1 || *turn == c2));

    // The empty queue is the default queue, under either spelling, and nothing else.
    assert_eq!(
        listed(&registry, "local", "", "dev", None),
        vec![default_queue.id()]
    );
    assert_eq!(
        listed(&registry, "local", "default", "dev", None),
        vec![default_queue.id()]
    );
}

#[test]
fn one_task_queue_name_in_two_namespaces_is_two_pools() {
    let registry = Registry::default();
    let local = admit(&registry, registration(&["local"], "gpu", "", &["render"]));
    let remote = admit(&registry, registration(&["remote"], "gpu", "", &["render"]));

    assert_eq!(
        listed(&registry, "local", "gpu", "render", None),
        vec![local.id()]
    );
    assert_eq!(
        listed(&registry, "remote", "gpu", "render", None),
        vec![remote.id()]
    );
    drop(local.token);
    assert!(listed(&registry, "local", "gpu", "render", None).is_empty());
    assert_eq!(
        listed(&registry, "remote", "gpu", "render", None),
        vec![remote.id()]
    );
}

#[test]
fn a_namespace_set_worker_is_reachable_in_each_and_only_those() {
    let registry = Registry::default();
    let both = admit(&registry, registration(&["a", "b"], "", "", &["dev"]));
    let only_a = admit(&registry, registration(&["a"], "", "", &["dev"]));

    let in_a: BTreeSet<WorkerId> = listed(&registry, "a", "", "dev", None)
        .into_iter()
        .collect();
    assert_eq!(in_a, BTreeSet::from([both.id(), only_a.id()]));
    assert_eq!(listed(&registry, "b", "", "dev", None), vec![both.id()]);
    for _ in 0..3 {
        assert_eq!(pick(&registry, "b", "", "dev", None), Some(both.id()));
    }
    assert!(listed(&registry, "c", "", "dev", None).is_empty());

    drop(both.token);
    assert!(listed(&registry, "b", "", "dev", None).is_empty());
    assert_eq!(listed(&registry, "a", "", "dev", None), vec![only_a.id()]);
}

#[test]
fn a_node_pin_filters_within_the_pool() {
    let registry = Registry::default();
    let n1 = admit(&registry, registration(&["ns"], "tq", "n1", &["dev"]));
    let n2 = admit(&registry, registration(&["ns"], "tq", "n2", &["dev"]));

    assert_eq!(listed(&registry, "ns", "tq", "dev", None).len(), 2);
    for _ in 0..3 {
        assert_eq!(
            pick(&registry, "ns", "tq", "dev", Some("n1")),
            Some(n1.id())
        );
        assert_eq!(
            pick(&registry, "ns", "tq", "dev", Some("n2")),
            Some(n2.id())
        );
    }
    assert_eq!(
        listed(&registry, "ns", "tq", "dev", Some("n1")),
        vec![n1.id()]
    );
    assert_eq!(
        listed(&registry, "ns", "tq", "dev", Some("n2")),
        vec![n2.id()]
    );
    assert!(listed(&registry, "ns", "tq", "dev", Some("absent")).is_empty());
    assert_eq!(pick(&registry, "ns", "tq", "dev", Some("absent")), None);
}

#[test]
fn a_pin_to_a_shared_node_round_robins_across_its_workers() {
    let registry = Registry::default();
    let a = admit(&registry, registration(&["ns"], "tq", "shared", &["dev"]));
    let elsewhere = admit(&registry, registration(&["ns"], "tq", "other", &["dev"]));
    let b = admit(&registry, registration(&["ns"], "tq", "shared", &["dev"]));

    let turns: Vec<Option<WorkerId>> = (0..4)
        .map(|_| pick(&registry, "ns", "tq", "dev", Some("shared")))
        .collect();
    assert_eq!(
        turns,
        vec![Some(a.id()), Some(b.id()), Some(a.id()), Some(b.id())]
    );
    assert!(!turns.contains(&Some(elsewhere.id())));
}

#[test]
fn unpinned_selection_rotates_across_nodes_in_order() {
    let registry = Registry::default();
    let n1 = admit(&registry, registration(&["ns"], "tq", "n1", &["dev"]));
    let n2 = admit(&registry, registration(&["ns"], "tq", "n2", &["dev"]));

    let nodes: Vec<Option<String>> = (0..4)
        .map(|_| {
            let (worker, _slot) = registry
                .select_and_reserve("ns", "tq", "dev", None)
                .unwrap();
            worker.node().map(|node| node.as_str().to_owned())
        })
        .collect();
    let n = |label: &str| Some(label.to_owned());
    assert_eq!(nodes, vec![n("n1"), n("n2"), n("n1"), n("n2")]);
    drop((n1, n2));
}

#[test]
fn pinned_unpinned_and_listing_lookups_share_one_cursor() {
    let registry = Registry::default();
    let w1 = admit(&registry, registration(&["ns"], "tq", "n1", &["dev"]));
    let w2 = admit(&registry, registration(&["ns"], "tq", "n2", &["dev"]));
    let w3 = admit(&registry, registration(&["ns"], "tq", "n1", &["dev"]));

    assert_eq!(pick(&registry, "ns", "tq", "dev", None), Some(w1.id()));
    // The pinned lookup starts after w1 within n1 and lands on w3 ...
    assert_eq!(
        pick(&registry, "ns", "tq", "dev", Some("n1")),
        Some(w3.id())
    );
    // ... and the unpinned one continues after w3 (a separate cursor would give w2).
    assert_eq!(pick(&registry, "ns", "tq", "dev", None), Some(w1.id()));
    // The listing starts where selection stands and moves the same cursor past its head.
    assert_eq!(
        listed(&registry, "ns", "tq", "dev", None),
        vec![w2.id(), w3.id(), w1.id()]
    );
    assert_eq!(pick(&registry, "ns", "tq", "dev", None), Some(w3.id()));
}

/// The ways a registered worker can be ineligible, each with its way back.
#[derive(Clone, Copy, Debug)]
enum Ineligible {
    Unreachable,
    Probation,
    AtCapacity,
    Unannounced,
    Draining,
    Disconnected,
}

#[test]
fn an_ineligible_worker_is_never_chosen_by_either_selector() {
    for kind in [
        Ineligible::Unreachable,
        Ineligible::Probation,
        Ineligible::AtCapacity,
        Ineligible::Unannounced,
        Ineligible::Draining,
        Ineligible::Disconnected,
    ] {
        let registry = Registry::default();
        // The excluded worker is the lowest id: the one a naive "first match" would take.
        let leg = match kind {
            Ineligible::Unannounced => TestLeg::announcing(),
            _ => TestLeg::new(),
        };
        let mut first = registration(&["ns"], "tq", "", &["dev"]);
        first.max_concurrency = Some(1);
        let excluded = admit_on(&registry, first, leg);
        let others = [
            admit(&registry, registration(&["ns"], "tq", "", &["dev"])),
            admit(&registry, registration(&["ns"], "tq", "", &["dev"])),
        ];
        let id = excluded.id();

        let mut held = None;
        match kind {
            Ineligible::Unreachable | Ineligible::Probation => {
                let exclusion = match kind {
                    Ineligible::Probation => DispatchExclusion::OpeningProbation,
                    _ => DispatchExclusion::ReachabilityLost,
                };
                registry.set_dispatch_ineligible(HashMap::from([(id, exclusion)]));
            }
            Ineligible::AtCapacity => {
                held = hold(&registry, "ns", "tq", "dev");
                assert_eq!(held.as_ref().map(|slot| slot.worker()), Some(id));
            }
            Ineligible::Unannounced => {}
            Ineligible::Draining => {
                assert!(listed(&registry, "ns", "tq", "dev", None).contains(&id));
                assert!(registry.drain_worker(id));
            }
            Ineligible::Disconnected => excluded.leg.set_connected(false),
        }

        for round in 0..4 {
            let chosen = pick(&registry, "ns", "tq", "dev", None);
            assert!(chosen.is_some(), "{kind:?}: two eligible workers remain");
            assert_ne!(
                chosen,
                Some(id),
                "{kind:?}: select_and_reserve chose it (round {round})"
            );
            let list = listed(&registry, "ns", "tq", "dev", None);
            assert_eq!(
                list.len(),
                2,
                "{kind:?}: workers_for lists only the eligible two"
            );
            assert!(!list.contains(&id), "{kind:?}: workers_for listed it");
        }

        // The way back proves the worker was excluded, not lost.
        match kind {
            Ineligible::Unreachable | Ineligible::Probation => {
                registry.set_dispatch_ineligible(HashMap::new());
            }
            Ineligible::AtCapacity => drop(held.take()),
            Ineligible::Unannounced => registry.set_advertised_capacity(id, 1).unwrap(),
            Ineligible::Draining => continue,
            Ineligible::Disconnected => excluded.leg.set_connected(true),
        }
        let turns: Vec<_> = (0..3)
            .map(|_| pick(&registry, "ns", "tq", "dev", None))
            .collect();
        assert!(
            turns.contains(&Some(id)),
            "{kind:?}: restored worker is chosen again"
        );
        drop(others);
    }
}

#[test]
fn simultaneous_selections_claim_exactly_the_advertised_slots() {
    const CAPACITY: u32 = 4;
    const RACERS: usize = 32;
    let registry = Registry::default();
    let mut only = registration(&["ns"], "", "", &["charge"]);
    only.max_concurrency = Some(CAPACITY);
    let worker = admit(&registry, only);

    let start = Arc::new(Barrier::new(RACERS));
    let won: Vec<_> = std::thread::scope(|scope| {
        let racers: Vec<_> = (0..RACERS)
            .map(|_| {
                let registry = registry.clone();
                let start = Arc::clone(&start);
                scope.spawn(move || {
                    start.wait();
                    registry.select_and_reserve("ns", "", "charge", None)
                })
            })
            .collect();
        racers
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .collect()
    });

    let granted = won.iter().filter(|slot| slot.is_some()).count();
    assert_eq!(
        granted, CAPACITY as usize,
        "{RACERS} racers against capacity {CAPACITY}"
    );
    assert_eq!(registry.worker(worker.id()).unwrap().in_flight, CAPACITY);

    drop(won);
    assert_eq!(registry.worker(worker.id()).unwrap().in_flight, 0);
    assert_eq!(pick(&registry, "ns", "", "charge", None), Some(worker.id()));
}

#[test]
fn the_rotation_is_pruned_when_its_last_worker_leaves() {
    let registry = Registry::default();
    let dev = admit(&registry, registration(&["ns"], "tq", "", &["dev"]));
    let ops = admit(&registry, registration(&["ns"], "tq", "", &["ops"]));
    assert_eq!(pick(&registry, "ns", "tq", "dev", None), Some(dev.id()));
    assert!(registry.inner.lock().rotation("ns", "tq", "dev").is_some());

    drop(dev.token);
    {
        let state = registry.inner.lock();
        assert!(
            state.rotation("ns", "tq", "dev").is_none(),
            "the emptied key is pruned"
        );
        assert!(
            state.rotation("ns", "tq", "ops").is_some(),
            "a key still served is kept"
        );
    }

    drop(ops.token);
    assert!(
        registry.inner.lock().pools.is_empty(),
        "no namespace or queue outlives its workers"
    );
}
