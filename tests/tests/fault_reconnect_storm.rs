//! Reconnect storm: every worker of a pool (half gRPC, half QUIC) is killed at once while it
//! holds work, and as many new workers connect at once. The registry ends consistent: the
//! registered set is exactly the new workers, the census counts them all eligible, nothing
//! stays reserved, in-flight counts are back to zero, and every dispatch ended once: completed, or `TransportLost` only past the
//! loss budget.
//!
//! Short variant (always on): 200 workers. Long variant (`SWITCHYARD_LONG_TESTS=1`): 1,000.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity, WorkerId};
use switchyard_gateway::ConfigDuration;
use switchyard_tests::{
    FaultSpec, FaultWorker, TestGateway, Work, grpc_fault_worker, long_tests, quic_fault_worker,
    wait_eligible,
};

/// How many workers connect at once while the storm is built or rebuilt.
const CONNECTING: usize = 32;
const CAPACITY: u32 = 2;
/// Every worker dies at once, so a task may be handed to several dead workers before their
/// departures are seen; past this many losses it ends `TransportLost`, which is its one outcome.
const LOSS_BUDGET: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_storm_leaves_the_registry_consistent() {
    let workers = if long_tests() { 1_000 } else { 200 };
    let gateway = TestGateway::start(|config| {
        config.liveness.heartbeat_window = ConfigDuration::secs(5);
        // Probing 2,000 workers every 200 ms would be the test's whole load.
        config.liveness.ping_interval = ConfigDuration::secs(1);
        config.liveness.ping_timeout = ConfigDuration::secs(2);
        config.quic.max_unregistered_connections = 4 * CONNECTING;
        // Every worker dials from 127.0.0.1, the killed ones' connections lingering meanwhile.
        config.quic.max_connections_per_address = 2 * workers;
        config.dispatch.loss_budget = LOSS_BUDGET;
    })
    .await;
    let spec = FaultSpec {
        namespace: "storm".to_owned(),
        activity: "echo".to_owned(),
        capacity: CAPACITY,
        work: Work::For(Duration::from_millis(50)),
    };
    let before = connect_all(&gateway, &spec, workers).await;
    wait_eligible(&gateway, "storm", "echo", workers).await;

    let core = gateway.gateway().core().clone();
    let registry = core.registry().clone();
    let dispatches = workers;
    let dispatcher = core.dispatcher().clone();
    let load = tokio::spawn(async move {
        let caller = CallerIdentity::trusted("producer");
        futures::stream::iter(0..dispatches)
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
            .buffer_unordered(dispatches)
            .collect::<Vec<_>>()
            .await
    });
    // The storm hits while tasks are out on the workers.
    let busy = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if before.iter().map(|w| w.gauge.running()).sum::<u32>() >= 8 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(busy.is_ok(), "the load never reached the workers");
    for worker in &before {
        worker.kill();
    }
    let after = connect_all(&gateway, &spec, workers).await;

    let outcomes = tokio::time::timeout(Duration::from_secs(120), load)
        .await
        .expect("every dispatch ends")
        .expect("load task");
    assert_eq!(outcomes.len(), dispatches);
    let mut lost = 0;
    for (input, outcome) in &outcomes {
        match outcome {
            ActivityOutcome::Completed(output) => assert_eq!(output, input),
            ActivityOutcome::TransportLost { attempts, .. } => {
                assert!(
                    *attempts > LOSS_BUDGET,
                    "lost within the budget after {attempts} attempts"
                );
                lost += 1;
            }
            other => panic!("dispatch {input:?} ended {}", other.label()),
        }
    }
    eprintln!("storm: {lost} of {dispatches} dispatches lost past the budget of {LOSS_BUDGET}");

    let killed: BTreeSet<WorkerId> = before.iter().map(|w| w.id).collect();
    let connected: BTreeSet<WorkerId> = after.iter().map(|w| w.id).collect();
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let arrival = registry.worker_arrival();
            let registered: BTreeSet<WorkerId> =
                registry.workers().iter().map(|w| w.worker.id()).collect();
            let census = registry.pool_census("storm", "", "echo", None);
            if registered == connected && census.eligible == workers {
                return;
            }
            // Departures wake nobody; arrivals and a short tick cover both.
            let _ = tokio::time::timeout(Duration::from_millis(100), arrival).await;
        }
    })
    .await;
    let snapshot = registry.workers();
    let census = registry.pool_census("storm", "", "echo", None);
    assert!(
        settled.is_ok(),
        "registry never settled: {} registered ({} killed ones), census {census:?}",
        snapshot.len(),
        snapshot
            .iter()
            .filter(|w| killed.contains(&w.worker.id()))
            .count()
    );
    assert_eq!(census.pool_workers, workers);
    assert_eq!(census.activity_workers, workers);
    assert_eq!(census.compatible, workers);
    assert_eq!(census.eligible, workers);
    assert_eq!(census.at_capacity, 0, "leaked reservations: {census:?}");
    assert_eq!(core.dispatcher().pending_tasks(), 0);
    for worker in &snapshot {
        assert_eq!(
            worker.in_flight,
            0,
            "worker {} still holds work",
            worker.worker.id()
        );
    }
    for worker in before.iter().chain(&after) {
        assert!(worker.gauge.peak() <= CAPACITY);
    }
}

async fn connect_all(gateway: &TestGateway, spec: &FaultSpec, count: usize) -> Vec<FaultWorker> {
    let grpc = gateway.gateway().addr("grpc").expect("grpc listens");
    let quic = gateway.gateway().addr("quic").expect("quic listens");
    futures::stream::iter(0..count)
        .map(|i| async move {
            if i % 2 == 0 {
                grpc_fault_worker(gateway, grpc, spec).await
            } else {
                quic_fault_worker(gateway, quic, spec).await
            }
        })
        .buffer_unordered(CONNECTING)
        .collect()
        .await
}

fn request(input: Bytes) -> ActivityRequest {
    ActivityRequest {
        namespace: "storm".to_owned(),
        task_queue: String::new(),
        activity_type: "echo".to_owned(),
        node: None,
        input,
        activity_id: None,
        timeout: Duration::from_secs(60),
    }
}
