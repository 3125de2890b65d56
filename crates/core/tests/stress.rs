//! 10,000 dispatches over 8 in-memory workers with random capacities, random failures and
//! random worker loss: every dispatch ends with exactly one outcome, its own; no worker ever
//! holds more tasks than its capacity (counted on the worker side).
#![cfg(feature = "testkit")]
// Test helpers outside `#[test]` functions assert too.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use switchyard_core::testkit::memory::{MemoryGateway, MemoryWorker};
use switchyard_core::testkit::{Handler, TaskCall, conformance_config};
use switchyard_core::{
    ActivityOutcome, ActivityRequest, CallerIdentity, Core, RefusedCounts, Registration, Registry,
    TaskResult,
};
use tokio::sync::{Semaphore, mpsc};

const DISPATCHES: usize = 10_000;
const WORKERS: usize = 8;
const IN_FLIGHT: usize = 256;
/// One worker is severed (and replaced) after every this many outcomes.
const LOSS_EVERY: usize = 400;

/// Echoes `id` back, fails ids divisible by 7, and yields a pseudo-random number of times so
/// tasks overlap on the worker.
fn handler() -> Handler {
    Handler::new(|call: TaskCall| async move {
        let id: u64 = std::str::from_utf8(&call.input)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        for _ in 0..(id % 13) {
            tokio::task::yield_now().await;
        }
        if id % 7 == 0 {
            TaskResult::Failure {
                message: format!("failed {id}"),
                retryable: id % 2 == 0,
            }
        } else {
            TaskResult::Success(call.input)
        }
    })
}

async fn connect(gateway: &MemoryGateway, capacity: u32) -> MemoryWorker {
    let registration = Registration {
        namespaces: ["stress".to_owned()].into(),
        activity_types: ["echo".to_owned()].into(),
        max_concurrency: Some(capacity),
        ..Registration::default()
    };
    gateway
        .connect(&CallerIdentity::trusted("worker"), registration, handler())
        .await
        .expect("admitted")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dispatches_each_end_once_with_their_own_outcome() {
    let mut rng = StdRng::seed_from_u64(0x5717_c4ad);
    let core = Core::start(Registry::builder(), conformance_config());
    let gateway = MemoryGateway::new(core.clone());
    let mut live: Vec<(MemoryWorker, u32)> = Vec::new();
    for _ in 0..WORKERS {
        let capacity = rng.random_range(1..=8);
        live.push((connect(&gateway, capacity).await, capacity));
    }
    let mut retired: Vec<(MemoryWorker, u32)> = Vec::new();

    let (outcomes, mut collected) = mpsc::channel(IN_FLIGHT);
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let producer = {
        let core = core.clone();
        let permits = Arc::clone(&permits);
        tokio::spawn(async move {
            for id in 0..DISPATCHES as u64 {
                let permit = Arc::clone(&permits)
                    .acquire_owned()
                    .await
                    .expect("semaphore open");
                let core = core.clone();
                let outcomes = outcomes.clone();
                tokio::spawn(async move {
                    let request = ActivityRequest {
                        namespace: "stress".to_owned(),
                        task_queue: String::new(),
                        activity_type: "echo".to_owned(),
                        node: None,
                        input: Bytes::from(id.to_string()),
                        activity_id: Some(format!("a{id}")),
                        timeout: Duration::from_secs(60),
                    };
                    let outcome = core
                        .dispatcher()
                        .dispatch(&CallerIdentity::trusted("producer"), request)
                        .await
                        .expect("accepted");
                    let _ = outcomes.send((id, outcome)).await;
                    drop(permit);
                });
            }
        })
    };

    let mut seen = vec![0u8; DISPATCHES];
    let mut transport_lost = 0;
    let mut lost_in_flight = 0;
    for n in 1..=DISPATCHES {
        let (id, outcome) = tokio::time::timeout(Duration::from_secs(60), collected.recv())
            .await
            .expect("outcomes keep coming")
            .expect("producer alive");
        seen[id as usize] += 1;
        match outcome {
            ActivityOutcome::Completed(output) => {
                assert_ne!(id % 7, 0, "dispatch {id} should have failed");
                assert_eq!(
                    output,
                    Bytes::from(id.to_string()),
                    "dispatch {id} got another's output"
                );
            }
            ActivityOutcome::Failed { message, retryable } => {
                assert_eq!(
                    message,
                    format!("failed {id}"),
                    "dispatch {id} got another's failure"
                );
                assert_eq!(retryable, id % 2 == 0);
            }
            // Legitimate only when its workers kept being lost past the budget.
            ActivityOutcome::TransportLost { .. } => transport_lost += 1,
            other => panic!("dispatch {id} ended {other:?}"),
        }
        if n % LOSS_EVERY == 0 {
            let victim = rng.random_range(0..live.len());
            let (worker, capacity) = live.swap_remove(victim);
            lost_in_flight += worker.held();
            worker.sever();
            retired.push((worker, capacity));
            let capacity = rng.random_range(1..=8);
            live.push((connect(&gateway, capacity).await, capacity));
        }
    }
    producer.await.expect("producer finished");

    assert!(
        seen.iter().all(|count| *count == 1),
        "every dispatch ended exactly once"
    );
    assert!(
        transport_lost < 10,
        "{transport_lost} dispatches lost past the budget"
    );
    assert!(
        lost_in_flight > 0,
        "control: severed workers held tasks that had to move"
    );
    for (worker, capacity) in live.iter().chain(&retired) {
        assert!(
            worker.peak_held() <= *capacity,
            "worker {} held {} tasks with capacity {capacity}",
            worker.id(),
            worker.peak_held()
        );
        assert_eq!(worker.overcommits(), 0);
    }
    assert!(
        live.iter().any(|(w, capacity)| w.peak_held() == *capacity),
        "control: the load filled at least one worker"
    );
    assert_eq!(core.dispatcher().pending_tasks(), 0);
    assert!(core.dispatcher().unserved_queues().is_empty());
    assert_eq!(
        RefusedCounts {
            late: 0,
            ..core.dispatcher().refused()
        },
        RefusedCounts::default(),
        "no result for an unknown or foreign task"
    );
}
