//! Wake-ups for parked selections: retention, and each event that wakes.

use std::collections::HashMap;
use std::task::Poll;

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
fn publishing_verdicts_wakes_a_parked_selection() {
    let registry = Registry::default();
    let mut waiting = registry.worker_arrival();
    assert_eq!(poll_once(&mut waiting), Poll::Pending);
    assert_eq!(
        poll_once(&mut waiting),
        Poll::Pending,
        "nothing happened yet"
    );

    registry.set_dispatch_ineligible(HashMap::new());
    assert_eq!(poll_once(&mut waiting), Poll::Ready(()));
}

#[test]
fn a_subscription_resolves_once_per_wake() {
    let registry = Registry::default();
    let mut arrival = registry.worker_arrival();
    registry.set_dispatch_ineligible(HashMap::new());
    registry.set_dispatch_ineligible(HashMap::new());
    assert_eq!(poll_once(&mut arrival), Poll::Ready(()));

    // A fresh subscription is needed per wait; the next one does not inherit old wakes.
    let mut next = registry.worker_arrival();
    assert_eq!(poll_once(&mut next), Poll::Pending);
}
