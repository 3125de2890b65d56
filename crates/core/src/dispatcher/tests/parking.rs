//! Parking on a miss: listed in `unserved_queues`, one WARN per episode, never a spin.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::dispatcher::*;
use crate::eligibility::DispatchExclusion;
use crate::registry::UnservedReason;

use super::fixture::*;

#[tokio::test(start_paused = true)]
async fn a_parked_dispatch_is_listed_with_reason_census_and_count_then_removed() {
    let s = setup();
    assert!(s.dispatcher.unserved_queues().is_empty());
    let running: Vec<_> = (0..3)
        .map(|i| s.spawn(request(&format!("p{i}"), Duration::from_secs(60))))
        .collect();
    s.parked(3).await;
    tokio::time::advance(Duration::from_secs(2)).await;
    let listed = s.dispatcher.unserved_queues();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let queue = &listed[0];
    assert_eq!(queue.address.namespace, NS);
    assert_eq!(queue.address.task_queue, crate::DEFAULT_TASK_QUEUE);
    assert_eq!(queue.address.activity_type, ACTIVITY);
    assert_eq!(queue.reason, UnservedReason::NoWorkers);
    assert_eq!(queue.census.pool_workers, 0);
    assert_eq!(queue.waiting, 3);
    assert_eq!(queue.oldest_wait, Duration::from_secs(2));

    let mut worker = s.worker(3).await;
    for _ in 0..3 {
        let task = worker.task().await;
        let input = String::from_utf8_lossy(&task.input).into_owned();
        s.dispatcher
            .complete(worker.id, task.task_id, success(&input))
            .expect("accepted");
    }
    for (i, running) in running.into_iter().enumerate() {
        assert_eq!(running.await.expect("joined"), completed(&format!("p{i}")));
    }
    assert!(
        s.dispatcher.unserved_queues().is_empty(),
        "served queues leave the list"
    );
}

#[tokio::test(start_paused = true)]
async fn the_listing_takes_a_fresh_census() {
    let s = setup();
    let mut busy = s.worker(1).await;
    let holding = s.spawn(request("hold", Duration::from_secs(60)));
    let task = busy.task().await;
    let _parked = s.spawn(request("wait", Duration::from_secs(60)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::AllAtCapacity
    );
    // The worker leaves (no wake for parked dispatches); the listing still tells the truth.
    busy.leave();
    let queue = &s.dispatcher.unserved_queues()[0];
    assert_eq!(queue.reason, UnservedReason::NoWorkers);
    assert_eq!(queue.census.last_compatible_departure, Some(Duration::ZERO));
    drop((holding, task));
}

#[tokio::test(start_paused = true)]
async fn one_warn_per_address_per_episode() {
    let s = setup();
    let first: Vec<_> = (0..5)
        .map(|_| s.spawn(request("a", Duration::from_secs(5))))
        .collect();
    s.parked(5).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        1,
        "five dispatches, one episode"
    );
    let mut other = request("b", Duration::from_secs(5));
    other.activity_type = "other".to_owned();
    let second = s.spawn(other);
    s.parked(6).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        2,
        "another address is another episode"
    );
    for running in first {
        assert!(matches!(
            running.await.expect("joined"),
            ActivityOutcome::Unserved { .. }
        ));
    }
    assert!(matches!(
        second.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
    assert!(s.dispatcher.unserved_queues().is_empty());
    let again = s.spawn(request("c", Duration::from_secs(5)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        3,
        "the address parks again: a new episode"
    );
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn probation_parks_quietly_and_warns_once_it_turns_into_an_incident() {
    let s = setup();
    let worker = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::OpeningProbation,
    )]));
    let running = s.spawn(request("x", Duration::from_secs(30)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::OnProbation
    );
    assert_eq!(
        s.dispatcher.unserved_warnings(),
        0,
        "probation is not an incident"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::ReachabilityLost,
    )]));
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(s.dispatcher.unserved_warnings(), 1);
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::WorkersUnreachable
    );
    drop(running);
}

#[tokio::test(start_paused = true)]
async fn a_pool_whose_workers_are_all_unreachable_is_reported_unreachable() {
    let s = setup();
    let lost = s.worker(1).await;
    let new = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([
        (lost.id, DispatchExclusion::ReachabilityLost),
        (new.id, DispatchExclusion::OpeningProbation),
    ]));
    let outcome = s
        .dispatcher
        .dispatch(&caller(), request("x", Duration::from_secs(1)))
        .await
        .expect("accepted");
    assert!(
        matches!(
            outcome,
            ActivityOutcome::Unserved {
                reason: UnservedReason::OnProbation,
                ..
            }
        ),
        "control: one worker on probation makes the wait transient, got {outcome:?}"
    );
    s.registry.set_dispatch_ineligible(HashMap::from([
        (lost.id, DispatchExclusion::ReachabilityLost),
        (new.id, DispatchExclusion::ReachabilityLost),
    ]));
    let running = s.spawn(request("x", Duration::from_secs(1)));
    s.parked(1).await;
    assert_eq!(
        s.dispatcher.unserved_queues()[0].reason,
        UnservedReason::WorkersUnreachable
    );
    let outcome = running.await.expect("joined");
    let ActivityOutcome::Unserved { reason, detail } = outcome else {
        panic!("expected unserved, got {outcome:?}");
    };
    assert_eq!(reason, UnservedReason::WorkersUnreachable);
    assert!(detail.contains("unreachable"), "{detail}");
}

#[tokio::test(start_paused = true)]
async fn a_dispatch_waiting_out_probation_selects_once_per_wake_not_in_a_loop() {
    let s = setup();
    let mut worker = s.worker(1).await;
    s.registry.set_dispatch_ineligible(HashMap::from([(
        worker.id,
        DispatchExclusion::OpeningProbation,
    )]));
    let running = s.spawn(request("x", Duration::from_secs(30)));
    s.parked(1).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    // One selection on arrival, one more once queued in its pool, then none until a wake.
    assert_eq!(s.dispatcher.selections(), 2, "parked, not polling");
    s.registry.set_dispatch_ineligible(HashMap::new());
    let task = worker.task().await;
    assert_eq!(
        s.dispatcher.selections(),
        3,
        "control: the verdict wakes it once"
    );
    s.dispatcher
        .complete(worker.id, task.task_id, success("x"))
        .expect("accepted");
    assert_eq!(running.await.expect("joined"), completed("x"));
}

#[tokio::test(start_paused = true)]
async fn a_worker_whose_link_dropped_before_it_left_parks_without_spinning() {
    let s = setup();
    let worker = s.worker(1).await;
    // Registered and counted eligible by the registry, but selection skips it.
    worker.leg.connected.store(false, Ordering::Release);
    let running = s.spawn(request("x", Duration::from_secs(10)));
    s.parked(1).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(
        s.dispatcher.selections(),
        2,
        "on arrival and once queued, no more"
    );
    assert!(matches!(
        running.await.expect("joined"),
        ActivityOutcome::Unserved { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_while_a_dispatch_misses_and_queues_is_not_lost() {
    // Producers contend for a worker of capacity 1 whose slot a responder frees on the other
    // thread, so slots are freed between a miss and the queueing. A wake lost there would leave
    // a dispatch parked until its deadline (Unserved) while the worker sat idle.
    const PRODUCERS: u64 = 4;
    const ROUNDS: u64 = 300;
    let s = setup();
    let mut worker = s.worker(1).await;
    let dispatcher = s.dispatcher.clone();
    let id = worker.id;
    // The responder starts once every producer but the one holding the slot has parked, so
    // the control below holds however the threads happen to be scheduled.
    let (start, started) = tokio::sync::oneshot::channel::<()>();
    let responder = tokio::spawn(async move {
        if started.await.is_err() {
            return;
        }
        while let Some(message) = worker.rx.recv().await {
            if let WorkerMessage::Task(task) = message {
                let _ = dispatcher.complete(id, task.task_id, TaskResult::Success(task.input));
            }
        }
    });
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let dispatcher = s.dispatcher.clone();
            tokio::spawn(async move {
                let mut completed = 0;
                for _ in 0..ROUNDS {
                    let outcome = dispatcher
                        .dispatch(&caller(), request("x", Duration::from_secs(5)))
                        .await;
                    if matches!(outcome, Ok(ActivityOutcome::Completed(_))) {
                        completed += 1;
                    }
                }
                completed
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while waiting(&s) < PRODUCERS as usize - 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the producers without the slot park"
        );
        tokio::task::yield_now().await;
    }
    start.send(()).expect("the responder waits for its start");
    let mut completed = 0;
    for producer in producers {
        completed += tokio::time::timeout(Duration::from_secs(120), producer)
            .await
            .expect("the producers finish well within their deadlines")
            .expect("joined");
    }
    assert_eq!(completed, PRODUCERS * ROUNDS, "every dispatch completed");
    // Control: dispatches did park (the window exists), so the count above covers wakes.
    assert!(
        s.dispatcher.selections() > PRODUCERS * ROUNDS,
        "some dispatches missed and selected again"
    );
    responder.abort();
}

/// Dispatches parked now, over every pool.
fn waiting(s: &super::fixture::Setup) -> usize {
    s.dispatcher
        .unserved_queues()
        .iter()
        .map(|q| q.waiting)
        .sum()
}
