//! `RegistrationToken::departed`: core tells the transport when, and why, it let a worker go.

use std::pin::pin;
use std::task::Poll;

use crate::events::DisconnectReason;
use crate::registry::Registry;
use crate::registry::testing::{TestLeg, admit, admit_on, poll_once, registration};

fn worker_registration() -> crate::registration::Registration {
    registration(&["ns"], "q", "", &["a"])
}

#[test]
fn departure_resolves_with_the_reason_core_deregistered_for() {
    let registry = Registry::default();
    let worker = admit(&registry, worker_registration());
    let mut departed = pin!(worker.token.departed());
    assert!(
        poll_once(&mut departed).is_pending(),
        "control: nothing resolves while the worker is registered"
    );
    assert!(registry.deregister(worker.id(), DisconnectReason::Timeout));
    assert_eq!(
        poll_once(&mut departed),
        Poll::Ready(DisconnectReason::Timeout)
    );
}

#[test]
fn departure_resolves_with_drained_when_a_drainless_leg_is_drained() {
    let registry = Registry::default();
    let worker = admit_on(&registry, worker_registration(), TestLeg::drainless());
    let departure = worker.token.departure();
    assert_eq!(departure.reason(), None, "control: still registered");
    assert!(registry.drain_worker(worker.id()));
    assert_eq!(departure.reason(), Some(DisconnectReason::Drained));
    let mut departed = pin!(departure.departed());
    assert_eq!(
        poll_once(&mut departed),
        Poll::Ready(DisconnectReason::Drained)
    );
}

#[test]
fn departure_asked_after_the_worker_left_resolves_at_once_with_the_first_reason() {
    let registry = Registry::default();
    let worker = admit(&registry, worker_registration());
    assert!(registry.deregister(worker.id(), DisconnectReason::Timeout));
    assert!(
        !registry.deregister(worker.id(), DisconnectReason::Drained),
        "a second deregistration changes nothing"
    );
    let mut departed = pin!(worker.token.departed());
    assert_eq!(
        poll_once(&mut departed),
        Poll::Ready(DisconnectReason::Timeout)
    );
}

#[test]
fn departures_are_per_worker() {
    let registry = Registry::default();
    let gone = admit(&registry, worker_registration());
    let staying = admit(&registry, worker_registration());
    assert!(registry.deregister(gone.id(), DisconnectReason::Disconnect));
    assert_eq!(
        gone.token.departure().reason(),
        Some(DisconnectReason::Disconnect)
    );
    let mut departed = pin!(staying.token.departed());
    assert!(
        poll_once(&mut departed).is_pending(),
        "another worker leaving does not resolve this one's departure"
    );
}
