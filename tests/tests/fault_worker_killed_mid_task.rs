//! Workers killed mid-task, over and over, on both transports, while dispatches keep coming:
//! every dispatch ends with exactly one outcome (its own input echoed back, so no result is
//! crossed or lost), the killed workers' tasks are re-dispatched, and no worker ever runs more
//! than it advertised nor holds more than that in the gateway's books.
//!
//! Short variant (always on): 12 rounds of 150 dispatches (1,800) over 8 workers. Long variant
//! (`SWITCHYARD_LONG_TESTS=1`): 40 rounds of 500 (20,000). Each round kills one worker holding
//! a task (alternating gRPC and QUIC, the victim drawn from a fixed seed) and replaces it.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity, Registry};
use switchyard_gateway::ConfigDuration;
use switchyard_tests::{
    FaultSpec, FaultWorker, Seeded, TestGateway, Work, grpc_fault_worker, long_tests,
    quic_fault_worker, wait_eligible,
};

const SEED: u64 = 0x5157_c4a7_0008;
const CAPACITY: u32 = 4;
const PER_TRANSPORT: usize = 4;
const IN_FLIGHT: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workers_lose_no_dispatch_and_never_exceed_capacity() {
    let (rounds, per_round) = if long_tests() { (40, 500) } else { (12, 150) };
    let gateway = TestGateway::start(|config| {
        config.liveness.heartbeat_window = ConfigDuration::secs(3);
        config.dispatch.loss_budget = 3;
    })
    .await;
    let spec = FaultSpec {
        namespace: "kill".to_owned(),
        activity: "echo".to_owned(),
        capacity: CAPACITY,
        work: Work::For(Duration::from_millis(2)),
    };
    let grpc_addr = gateway.gateway().addr("grpc").expect("grpc listens");
    let quic_addr = gateway.gateway().addr("quic").expect("quic listens");
    let mut grpc = Vec::new();
    let mut quic = Vec::new();
    for _ in 0..PER_TRANSPORT {
        grpc.push(grpc_fault_worker(&gateway, grpc_addr, &spec).await);
        quic.push(quic_fault_worker(&gateway, quic_addr, &spec).await);
    }
    wait_eligible(&gateway, "kill", "echo", 2 * PER_TRANSPORT).await;

    let core = gateway.gateway().core().clone();
    let registry = core.registry().clone();
    let running = Arc::new(AtomicBool::new(true));
    let books = tokio::spawn(watch_books(registry.clone(), Arc::clone(&running)));
    let mut seeded = Seeded::new(SEED);
    let mut retired: Vec<FaultWorker> = Vec::new();
    let mut total = 0usize;

    for round in 0..rounds {
        let first = round * per_round;
        let dispatcher = core.dispatcher().clone();
        let load = tokio::spawn(async move {
            let caller = CallerIdentity::trusted("producer");
            futures::stream::iter(first..first + per_round)
                .map(|id| {
                    let (dispatcher, caller) = (dispatcher.clone(), caller.clone());
                    async move {
                        let input = Bytes::from(id.to_string());
                        let outcome = dispatcher
                            .dispatch(&caller, request(input.clone()))
                            .await
                            .expect("dispatch accepted");
                        (input, outcome)
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .collect::<Vec<_>>()
                .await
        });

        let (pool, transport) = if round % 2 == 0 {
            (&mut grpc, "grpc")
        } else {
            (&mut quic, "quic")
        };
        let victim = usize::try_from(seeded.below(PER_TRANSPORT as u64)).expect("small index");
        assert!(
            pool[victim]
                .gauge
                .wait_running(1, Duration::from_secs(10))
                .await,
            "round {round}: the {transport} victim never got a task"
        );
        pool[victim].kill();
        let outcomes = tokio::time::timeout(Duration::from_secs(60), load)
            .await
            .unwrap_or_else(|_| panic!("round {round}: dispatches did not all end"))
            .expect("load task");

        assert_eq!(outcomes.len(), per_round, "round {round}: one outcome each");
        for (input, outcome) in &outcomes {
            assert_eq!(
                outcome,
                &ActivityOutcome::Completed(input.clone()),
                "round {round}: the dispatch of {input:?} (its worker maybe killed) ended otherwise"
            );
        }
        total += outcomes.len();
        let replacement = if transport == "grpc" {
            grpc_fault_worker(&gateway, grpc_addr, &spec).await
        } else {
            quic_fault_worker(&gateway, quic_addr, &spec).await
        };
        retired.push(std::mem::replace(&mut pool[victim], replacement));
        wait_eligible(&gateway, "kill", "echo", 2 * PER_TRANSPORT).await;
    }
    running.store(false, Ordering::SeqCst);
    let samples = books.await.expect("books watcher");

    assert_eq!(total, rounds * per_round);
    assert!(samples > 0, "the gateway's books were never sampled");
    for worker in grpc.iter().chain(&quic).chain(&retired) {
        assert!(
            worker.gauge.peak() <= CAPACITY,
            "worker {} ran {} tasks at once, advertised {CAPACITY}",
            worker.id,
            worker.gauge.peak()
        );
    }
    for worker in &retired {
        assert!(
            !registry.is_registered(worker.id),
            "killed worker {} is still registered",
            worker.id
        );
    }
    // Idle again: nothing stays reserved on any worker.
    let idle = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if registry.workers().iter().all(|w| w.in_flight == 0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        idle.is_ok(),
        "in-flight counts did not return to zero: {:?}",
        registry
            .workers()
            .iter()
            .map(|w| (w.worker.id(), w.in_flight))
            .collect::<Vec<_>>()
    );
}

fn request(input: Bytes) -> ActivityRequest {
    ActivityRequest {
        namespace: "kill".to_owned(),
        task_queue: String::new(),
        activity_type: "echo".to_owned(),
        node: None,
        input,
        activity_id: None,
        timeout: Duration::from_secs(30),
    }
}

/// Samples every worker's in-flight count against its capacity while the load runs.
async fn watch_books(registry: Registry, running: Arc<AtomicBool>) -> u64 {
    let mut samples = 0;
    while running.load(Ordering::SeqCst) {
        for worker in registry.workers() {
            let capacity = worker.capacity.unwrap_or(0);
            assert!(
                worker.in_flight <= capacity,
                "worker {} holds {} tasks in the gateway's books, capacity {capacity}",
                worker.worker.id(),
                worker.in_flight
            );
        }
        samples += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    samples
}
