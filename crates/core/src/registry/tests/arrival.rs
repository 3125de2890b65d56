//! Wake-ups for parked selections: retention, and each event that wakes.

use std::collections::HashMap;
use std::task::Poll;

use crate::eligibility::DispatchExclusion;
use crate::registry::Registry;
use crate::registry::testing::{admit, poll_once, registration};

#[test]
fn an_arrival_subscription_retains_a_wake_fired_before_it_is_awaited() {
    let registry = Registry::default();

    // Control: a subscription taken after a registration has nothing to retain.
    let _first = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let mut too_late = registry.worker_arrival();
    assert_eq!(poll_once(&mut too_late), Poll::Pending);
    assert_eq!(poll_once(&mut too_late), Poll::Pending);

    // Subject: subscribed first, the registration lands before the first poll.
    let mut arrival = registry.worker_arrival();
    let _second = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    assert_eq!(poll_once(&mut arrival), Poll::Ready(()));
    // The control was parked on the lost wake, not on a registry that never wakes.
    assert_eq!(poll_once(&mut too_late), Poll::Ready(()));
}

#[test]
fn publishing_a_changed_verdict_wakes_a_parked_selection() {
    let registry = Registry::default();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let id = worker.token.worker_id();
    let mut waiting = registry.worker_arrival();
    assert_eq!(
        poll_once(&mut waiting),
        Poll::Pending,
        "nothing happened yet"
    );

    // Control: a round that changes nobody's standing wakes nobody.
    registry.set_dispatch_ineligible(HashMap::new());
    assert_eq!(poll_once(&mut waiting), Poll::Pending);

    registry.set_dispatch_ineligible(HashMap::from([(id, DispatchExclusion::ReachabilityLost)]));
    assert_eq!(
        poll_once(&mut waiting),
        Poll::Ready(()),
        "an exclusion wakes, to reclassify"
    );

    let mut recovering = registry.worker_arrival();
    registry.set_dispatch_ineligible(HashMap::new());
    assert_eq!(
        poll_once(&mut recovering),
        Poll::Ready(()),
        "a recovery wakes"
    );
}

#[test]
fn a_subscription_resolves_once_per_wake() {
    let registry = Registry::default();
    let worker = admit(&registry, registration(&["ns"], "", "", &["dev"]));
    let lost = HashMap::from([(
        worker.token.worker_id(),
        DispatchExclusion::ReachabilityLost,
    )]);
    let mut arrival = registry.worker_arrival();
    registry.set_dispatch_ineligible(lost);
    registry.set_dispatch_ineligible(HashMap::new());
    assert_eq!(poll_once(&mut arrival), Poll::Ready(()));

    // A fresh subscription is needed per wait; the next one does not inherit old wakes.
    let mut next = registry.worker_arrival();
    assert_eq!(poll_once(&mut next), Poll::Pending);
}
