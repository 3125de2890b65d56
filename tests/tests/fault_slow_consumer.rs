//! A slow consumer: a gRPC worker behind a link that carries 4 KiB per 100 ms towards it,
//! loaded with large tasks. Dispatch to the other workers (gRPC and QUIC) goes on at full
//! speed, every dispatch they take completes, the slow worker is never handed more than its
//! capacity, and the gateway's memory does not grow with the volume pushed past it.
// Helpers outside #[test] functions fail the test the same way the tests do.
#![allow(clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchyard_core::{ActivityOutcome, ActivityRequest, CallerIdentity};
use switchyard_tests::{
    FaultSpec, TcpRelay, TestGateway, Work, grpc_fault_worker, quic_fault_worker, wait_eligible,
};
use tokio_util::sync::CancellationToken;

const SLOW_CAPACITY: u32 = 8;
const LARGE: usize = 128 * 1024;
/// Phase two pushes this many large inputs (100 MiB) through the fast workers.
const PUSHED: usize = 800;
/// Far below the volume pushed: growth this large would mean inputs are being kept.
const RSS_GROWTH_LIMIT: u64 = 64 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_neither_stalls_the_others_nor_grows_gateway_memory() {
    let gateway = TestGateway::start(|_| {}).await;
    let grpc = gateway.gateway().addr("grpc").expect("grpc listens");
    let quic = gateway.gateway().addr("quic").expect("quic listens");
    let relay = TcpRelay::throttled(grpc, Duration::from_millis(100))
        .await
        .expect("relay starts");
    let release = CancellationToken::new();
    let slow = grpc_fault_worker(
        &gateway,
        relay.addr(),
        &FaultSpec {
            namespace: "slow".to_owned(),
            activity: "echo".to_owned(),
            capacity: SLOW_CAPACITY,
            work: Work::Until(release.clone()),
        },
    )
    .await;
    wait_eligible(&gateway, "slow", "echo", 1).await;
    let fast_spec = FaultSpec {
        namespace: "slow".to_owned(),
        activity: "echo".to_owned(),
        capacity: 4,
        work: Work::For(Duration::ZERO),
    };
    let fast = [
        grpc_fault_worker(&gateway, grpc, &fast_spec).await,
        quic_fault_worker(&gateway, quic, &fast_spec).await,
    ];
    wait_eligible(&gateway, "slow", "echo", 3).await;

    let core = gateway.gateway().core().clone();
    let registry = core.registry().clone();
    let caller = CallerIdentity::trusted("producer");
    // Phase one: large tasks until the slow worker holds some it cannot read quickly.
    let mut stuck = Vec::new();
    for i in 0..3 * SLOW_CAPACITY {
        let dispatcher = core.dispatcher().clone();
        let caller = caller.clone();
        stuck.push(tokio::spawn(async move {
            dispatcher
                .dispatch(&caller, request(large(u64::from(i))))
                .await
        }));
    }
    let loaded = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if registry.worker(slow.id).is_some_and(|w| w.in_flight > 0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(loaded.is_ok(), "the slow worker never got a task");

    // Phase two: a steady stream the other workers must carry meanwhile.
    let before = resident_bytes();
    let dispatcher = core.dispatcher().clone();
    // Only verdicts are kept: the test must not hold the volume it measures.
    let verdicts: Vec<Result<(), &'static str>> = tokio::time::timeout(
        Duration::from_secs(120),
        futures::stream::iter(0..PUSHED)
            .map(|i| {
                let (dispatcher, caller) = (dispatcher.clone(), caller.clone());
                async move {
                    let input = large(1_000 + i as u64);
                    let outcome = dispatcher
                        .dispatch(&caller, request(input.clone()))
                        .await
                        .expect("dispatch accepted");
                    match outcome {
                        ActivityOutcome::Completed(output) if output == input => Ok(()),
                        other => Err(other.label()),
                    }
                }
            })
            .buffer_unordered(16)
            .collect(),
    )
    .await
    .expect("dispatch to the other workers is not stalled by the slow one");
    let after = resident_bytes();

    for verdict in &verdicts {
        assert_eq!(verdict, &Ok(()), "a dispatch did not echo its input");
    }
    let carried: u64 = fast.iter().map(|w| w.gauge.finished()).sum();
    assert!(
        carried >= PUSHED as u64,
        "the fast workers carried {carried} of {PUSHED}"
    );
    assert!(slow.gauge.peak() <= SLOW_CAPACITY);
    if let Some(books) = registry.worker(slow.id) {
        assert!(books.in_flight <= SLOW_CAPACITY);
    }
    let growth = after.saturating_sub(before);
    assert!(
        growth < RSS_GROWTH_LIMIT,
        "resident memory grew by {growth} bytes while {} bytes were pushed",
        PUSHED * LARGE
    );
    release.cancel();
    for task in stuck {
        task.abort();
    }
}

fn large(seed: u64) -> Bytes {
    let mut data = vec![0u8; LARGE];
    data[..8].copy_from_slice(&seed.to_be_bytes());
    Bytes::from(data)
}

fn request(input: Bytes) -> ActivityRequest {
    ActivityRequest {
        namespace: "slow".to_owned(),
        task_queue: String::new(),
        activity_type: "echo".to_owned(),
        node: None,
        input,
        activity_id: None,
        timeout: Duration::from_secs(60),
    }
}

/// This process's resident set (the gateway runs in it), from `/proc/self/statm`.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm readable");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("statm has a resident field");
    pages * 4096
}
