//! Admitted, not yet announced: registered and counted, but nothing reaches the worker and
//! nothing is dispatched to it until its transport announces it.

use crate::delivery::WorkerMessage;
use crate::events::WorkerEvent;
use crate::registration::CallerIdentity;
use crate::registry::Registry;
use crate::registry::testing::{Admitted, TestLeg, admit, pick, registration};

fn admit_unannounced(registry: &Registry) -> Admitted {
    let (leg, rx) = TestLeg::new();
    let token = futures::executor::block_on(registry.admit_unannounced(
        &CallerIdentity::trusted("tester"),
        registration(&["ns"], "q", "", &["a"]),
        leg.clone(),
    ))
    .unwrap();
    Admitted { token, leg, rx }
}

#[test]
fn an_unannounced_worker_is_counted_but_not_selected_until_announced() {
    let registry = Registry::default();
    let mut events = registry.subscribe_events();
    let worker = admit_unannounced(&registry);
    assert_eq!(registry.len(), 1, "registered and counted");
    assert_eq!(pick(&registry, "ns", "q", "a", None), None);
    assert!(
        events.try_recv().is_err(),
        "no event before the announcement"
    );

    assert!(worker.token.announce());
    assert_eq!(pick(&registry, "ns", "q", "a", None), Some(worker.id()));
    assert!(
        matches!(events.try_recv(), Ok(WorkerEvent::Connected { worker: id, .. })
        if id == worker.id())
    );
    assert!(
        matches!(events.try_recv(), Ok(WorkerEvent::CapacityAnnounced { worker: id, capacity: 4 })
        if id == worker.id()),
        "the stated capacity is announced after Connected"
    );
}

#[test]
fn a_shutdown_reaches_an_unannounced_worker_only_after_its_announcement() {
    let registry = Registry::default();
    let mut waiting = admit_unannounced(&registry);
    let mut announced = admit(&registry, registration(&["ns"], "q", "", &["a"]));
    assert_eq!(registry.broadcast_shutdown(), 2, "both are told");
    assert!(
        matches!(announced.rx.try_recv(), Ok(WorkerMessage::ShuttingDown)),
        "control: an announced worker is told at once"
    );
    assert!(
        waiting.rx.try_recv().is_err(),
        "nothing may overtake the transport's acknowledgement"
    );
    assert!(waiting.token.announce());
    assert!(matches!(
        waiting.rx.try_recv(),
        Ok(WorkerMessage::ShuttingDown)
    ));
    assert_eq!(
        pick(&registry, "ns", "q", "a", None),
        None,
        "fenced by the shutdown"
    );
}
