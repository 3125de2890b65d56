//! `explain`: every worker of the pool with the one reason it can or cannot take a dispatch.

use std::collections::HashMap;

use crate::address::{Node, WorkerId};
use crate::eligibility::{DispatchExclusion, Eligibility};
use crate::registry::Registry;
use crate::registry::testing::{TestLeg, admit, admit_on, hold, registration};

#[test]
fn explain_gives_each_worker_of_the_pool_its_one_reason() {
    let registry = Registry::default();
    let on = |node: &str| registration(&["ns"], "q", node, &["dev"]);
    let mut one = on("n1");
    one.max_concurrency = Some(1);
    let full = admit(&registry, one);
    let _slot = hold(&registry, "ns", "q", "dev").unwrap();
    let eligible = admit(&registry, on("n1"));
    let other_activity = admit(&registry, registration(&["ns"], "q", "n1", &["ops"]));
    let other_node = admit(&registry, on("n2"));
    let no_node = admit(&registry, on(""));
    let unannounced = admit_on(&registry, on("n1"), TestLeg::announcing());
    let probation = admit(&registry, on("n1"));
    let lost = admit(&registry, on("n1"));
    let draining = admit(&registry, on("n1"));
    let gone = admit(&registry, on("n1"));
    let _other_pool = admit(
        &registry,
        registration(&["ns"], "elsewhere", "n1", &["dev"]),
    );
    registry.set_dispatch_ineligible(HashMap::from([
        (probation.id(), DispatchExclusion::OpeningProbation),
        (lost.id(), DispatchExclusion::ReachabilityLost),
    ]));
    assert!(registry.drain_worker(draining.id()));
    gone.leg.set_connected(false);

    let explained: Vec<(WorkerId, Eligibility)> = registry
        .explain("ns", "q", "dev", Some("n1"))
        .into_iter()
        .map(|e| (e.worker.id(), e.eligibility))
        .collect();
    let expected = vec![
        (
            full.id(),
            Eligibility::AtCapacity {
                in_flight: 1,
                capacity: 1,
            },
        ),
        (eligible.id(), Eligibility::Eligible),
        (other_activity.id(), Eligibility::ServesOtherActivity),
        (
            other_node.id(),
            Eligibility::OtherNode {
                node: Node::new("n2"),
            },
        ),
        (no_node.id(), Eligibility::OtherNode { node: None }),
        (unannounced.id(), Eligibility::CapacityUnannounced),
        (probation.id(), Eligibility::OnProbation),
        (lost.id(), Eligibility::Unreachable),
        (draining.id(), Eligibility::Draining),
        (gone.id(), Eligibility::Disconnected),
    ];
    assert_eq!(
        explained, expected,
        "every worker of the pool, by id, and no other pool's"
    );

    let words: Vec<String> = expected.iter().map(|(_, e)| e.to_string()).collect();
    assert_eq!(
        words,
        [
            "at capacity 1/1",
            "eligible",
            "serves other activity types",
            "on other node n2",
            "advertises no node",
            "capacity unannounced",
            "on probation",
            "unreachable",
            "draining",
            "disconnected",
        ]
    );
}

#[test]
fn unpinned_explain_ignores_nodes_and_agrees_with_selection() {
    let registry = Registry::default();
    let a = admit(&registry, registration(&["ns"], "", "n1", &["dev"]));
    let b = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    registry.set_dispatch_ineligible(HashMap::from([(
        a.id(),
        DispatchExclusion::ReachabilityLost,
    )]));

    let explained: Vec<_> = registry
        .explain("ns", "", "dev", None)
        .into_iter()
        .map(|e| (e.worker.id(), e.eligibility))
        .collect();
    assert_eq!(
        explained,
        vec![
            (a.id(), Eligibility::Unreachable),
            (b.id(), Eligibility::Eligible)
        ]
    );
    let eligible: Vec<WorkerId> = registry
        .workers_for("ns", "", "dev", None)
        .iter()
        .map(|w| w.id())
        .collect();
    assert_eq!(
        eligible,
        vec![b.id()],
        "explain and selection share one derivation"
    );
}
