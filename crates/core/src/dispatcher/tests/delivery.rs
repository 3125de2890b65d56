//! Select and deliver: a refused delivery frees the slot and selects again, attempt-neutral; a
//! too-large task ends its dispatch at once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::dispatcher::*;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn a_refused_delivery_frees_the_slot_and_selects_again_without_an_attempt() {
    let s = setup();
    let mut refusing = s.worker(1).await;
    let mut taking = s.worker(1).await;
    refusing.leg.refuse_tasks.store(1, Ordering::Release);
    let running = s.spawn(request("x", Duration::from_secs(30)));
    let task = taking.task().await;
    assert_eq!(
        task.attempt, 1,
        "the refused delivery must not count as an attempt"
    );
    assert_eq!(s.in_flight(&refusing), 0, "the refused slot was freed");
    assert_eq!(
        s.in_flight(&taking),
        1,
        "control: the taken slot is counted"
    );
    assert!(refusing.sent().is_empty());
    s.dispatcher
        .complete(taking.id, task.task_id, success("x"))
        .expect("result accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_refusing_every_delivery_backs_off_instead_of_spinning() {
    let s = setup();
    let mut worker = s.worker(1).await;
    worker.leg.refuse_tasks.store(u32::MAX, Ordering::Release);
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(outcome, ActivityOutcome::Unserved { .. }),
        "{outcome:?}"
    );
    let tries = s.dispatcher.selections();
    // One second of backoff capped at 100 ms between tries: a few dozen, not millions.
    assert!(
        (5..=40).contains(&tries),
        "{tries} selection attempts in one second"
    );
    assert!(worker.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_input_over_max_input_bytes_is_refused_up_front_and_nothing_is_sent() {
    let s = setup_with(DispatchConfig {
        max_input_bytes: 10,
        ..DispatchConfig::default()
    });
    let mut worker = s.worker(1).await;
    let refused = s
        .dispatcher
        .dispatch(&caller(), request(&"x".repeat(11), Duration::from_secs(5)))
        .await;
    assert_eq!(
        refused,
        Err(DispatchError::InputTooLarge {
            size: 11,
            limit: 10
        })
    );
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("input is 11 bytes, more than the limit of 10 bytes a worker can receive".to_owned())
    );
    assert!(worker.sent().is_empty(), "no worker was offered the task");
    // Control: an input exactly at the limit is delivered.
    let running = s.spawn(request(&"x".repeat(10), Duration::from_secs(5)));
    let task = worker.task().await;
    assert_eq!(task.input.len(), 10);
    s.dispatcher
        .complete(worker.id, task.task_id, success("ok"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("ok"));
}

#[tokio::test(start_paused = true)]
async fn a_leg_refusing_a_task_as_too_large_ends_the_dispatch_at_once_and_keeps_the_worker() {
    let s = setup();
    let mut small = s.worker(1).await;
    let mut other = s.worker(1).await;
    small.leg.frame_limit.store(30, Ordering::Release);
    other.leg.frame_limit.store(30, Ordering::Release);
    let started = Instant::now();
    let refused = s
        .dispatcher
        .dispatch(&caller(), request(&"x".repeat(15), Duration::from_secs(30)))
        .await;
    assert_eq!(
        refused,
        Err(DispatchError::InputTooLarge {
            size: 15,
            limit: 30 - TASK_FRAMING
        }),
        "the limit is restated for the input, less the leg's framing"
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "refused at once, not at the deadline"
    );
    for worker in [&small, &other] {
        assert!(s.registry.is_registered(worker.id), "no worker leaves");
        assert_eq!(s.in_flight(worker), 0, "no slot stays held");
    }
    assert!(small.sent().is_empty() && other.sent().is_empty());
    // Control: the next input that fits is served by the same pool.
    let running = s.spawn(request(&"x".repeat(10), Duration::from_secs(30)));
    let (worker, task) = tokio::select! {
        task = small.task() => (small.id, task),
        task = other.task() => (other.id, task),
    };
    s.dispatcher
        .complete(worker, task.task_id, success("fits"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("fits"));
}
