//! Per-pool wake-ups: a change wakes only the selections parked on the pools it concerns, in
//! arrival order.

use std::task::Poll;

use crate::registry::Registry;
use crate::registry::testing::{admit, hold, poll_once, registration};

/// Polls a waiter's wake once.
fn woken(waiter: &mut crate::PoolWaiter) -> Poll<()> {
    let mut wait = Box::pin(waiter.woken());
    poll_once(&mut wait)
}

fn one_slot(registry: &Registry, namespace: &str) -> crate::registry::testing::Admitted {
    let mut one = registration(&[namespace], "", "", &["charge"]);
    one.max_concurrency = Some(1);
    admit(registry, one)
}

#[test]
fn a_slot_freed_in_one_pool_wakes_none_of_another_pools_waiters() {
    let registry = Registry::default();
    let _x = one_slot(&registry, "tenant-x");
    let _y = one_slot(&registry, "tenant-y");
    let held_x = hold(&registry, "tenant-x", "", "charge").expect("x has a slot");
    let held_y = hold(&registry, "tenant-y", "", "charge").expect("y has a slot");

    let mut parked_y: Vec<_> = (0..50)
        .map(|_| registry.pool_waiter("tenant-y", "", "charge", None))
        .collect();
    parked_y.iter_mut().for_each(crate::PoolWaiter::arm);
    let before = registry.inner.wakeups.lock().woken();

    drop(held_x);
    assert_eq!(
        registry.inner.wakeups.lock().woken(),
        before,
        "x's freed slot woke nobody"
    );
    for waiter in &mut parked_y {
        assert_eq!(woken(waiter), Poll::Pending);
    }

    // Control: a slot freed in y's own pool wakes one of y's waiters.
    drop(held_y);
    assert_eq!(registry.inner.wakeups.lock().woken(), before + 1);
    assert_eq!(woken(&mut parked_y[0]), Poll::Ready(()));
}

#[test]
fn a_freed_slot_wakes_the_oldest_waiter_and_a_loser_keeps_its_place() {
    let registry = Registry::default();
    let _worker = one_slot(&registry, "ns");
    let mut waiters: Vec<_> = (0..3)
        .map(|_| registry.pool_waiter("ns", "", "charge", None))
        .collect();
    waiters.iter_mut().for_each(crate::PoolWaiter::arm);

    let slot = hold(&registry, "ns", "", "charge").expect("a free slot");
    drop(slot);
    assert_eq!(
        woken(&mut waiters[0]),
        Poll::Ready(()),
        "first in, first woken"
    );
    assert_eq!(woken(&mut waiters[1]), Poll::Pending);
    assert_eq!(woken(&mut waiters[2]), Poll::Pending);

    // The first waiter loses the race (someone else took the slot) and re-queues: the next
    // freed slot is its again, not the second waiter's.
    waiters[0].arm();
    let stolen = hold(&registry, "ns", "", "charge").expect("the freed slot");
    drop(stolen);
    assert_eq!(woken(&mut waiters[0]), Poll::Ready(()), "back at the front");
    assert_eq!(woken(&mut waiters[1]), Poll::Pending);

    // Leaving after a wake without selecting passes the wake on, in order.
    let first = waiters.remove(0);
    drop(first);
    assert_eq!(
        woken(&mut waiters[0]),
        Poll::Ready(()),
        "the second inherits it"
    );
    assert_eq!(woken(&mut waiters[1]), Poll::Pending);
    assert_eq!(registry.inner.wakeups.lock().queued(), 1);
}

#[test]
fn an_arrival_wakes_every_waiter_of_its_pools_only() {
    let registry = Registry::default();
    let mut here = registry.pool_waiter("ns", "", "charge", None);
    let mut pinned_elsewhere = registry.pool_waiter("ns", "", "charge", Some("edge"));
    let mut other_activity = registry.pool_waiter("ns", "", "refund", None);
    for waiter in [&mut here, &mut pinned_elsewhere, &mut other_activity] {
        waiter.arm();
    }
    let _worker = admit(&registry, registration(&["ns"], "", "", &["charge"]));
    assert_eq!(woken(&mut here), Poll::Ready(()));
    assert_eq!(woken(&mut pinned_elsewhere), Poll::Pending, "wrong node");
    assert_eq!(woken(&mut other_activity), Poll::Pending, "another pool");
}

#[test]
fn each_freed_slot_wakes_its_own_waiter_even_when_the_worker_was_already_selectable() {
    let registry = Registry::default();
    let mut two = registration(&["ns"], "", "", &["charge"]);
    two.max_concurrency = Some(2);
    let _worker = admit(&registry, two);
    let first = hold(&registry, "ns", "", "charge").expect("slot 1");
    let second = hold(&registry, "ns", "", "charge").expect("slot 2");
    let mut waiters: Vec<_> = (0..3)
        .map(|_| registry.pool_waiter("ns", "", "charge", None))
        .collect();
    waiters.iter_mut().for_each(crate::PoolWaiter::arm);

    drop(first); // reopens the worker
    drop(second); // the worker was selectable already; still a slot for a parked waiter
    assert_eq!(woken(&mut waiters[0]), Poll::Ready(()));
    assert_eq!(
        woken(&mut waiters[1]),
        Poll::Ready(()),
        "the second slot's waiter"
    );
    // Control: two slots, two wakes; the third waiter waits.
    assert_eq!(woken(&mut waiters[2]), Poll::Pending);
}
