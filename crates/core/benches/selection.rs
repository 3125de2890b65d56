//! Cost of one selection: `select_and_reserve` plus dropping the reservation it returns.
//!
//! Pools of 16, 1,024 and 16,384 workers (capacity 4 each), idle or with 90% of the workers
//! holding every slot; the saturated workers are either scattered at random or contiguous in
//! rotation order. The bar: the largest pool costs at most twice the smallest, saturated too.
// Setup failures here are bugs in the bench itself; aborting loudly is the right response.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_main};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use switchyard_core::{
    CallerIdentity, DeliveryError, DispatchReservation, Registration, RegistrationToken, Registry,
    TransportName, WorkerDelivery, WorkerId, WorkerMessage,
};

const SIZES: [usize; 3] = [16, 1_024, 16_384];
const CAPACITY: u32 = 4;
const NAMESPACE: &str = "bench";
const TASK_QUEUE: &str = "q";
const ACTIVITY: &str = "work";

/// A delivery leg that accepts everything; selection never calls it.
struct Sink;

impl WorkerDelivery for Sink {
    fn transport(&self) -> TransportName {
        TransportName::from_static("bench")
    }
    fn is_connected(&self) -> bool {
        true
    }
    fn registration_carries_capacity(&self) -> bool {
        true
    }
    fn deliver(&self, _: WorkerMessage) -> Result<(), DeliveryError> {
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Saturation {
    Idle,
    Random,
    Contiguous,
}

impl Saturation {
    fn label(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Random => "saturated90_random",
            Self::Contiguous => "saturated90_contiguous",
        }
    }
}

/// A registry holding one pool of `size` workers, with the chosen 90% at capacity.
struct Fixture {
    registry: Registry,
    _tokens: Vec<RegistrationToken>,
    _held: Vec<DispatchReservation>,
}

fn fixture(size: usize, saturation: Saturation) -> Fixture {
    let registry = Registry::default();
    let caller = CallerIdentity::trusted("bench");
    let registration = Registration {
        namespaces: [NAMESPACE.to_owned()].into(),
        task_queue: TASK_QUEUE.to_owned(),
        activity_types: [ACTIVITY.to_owned()].into(),
        identity: "bench-worker".to_owned(),
        max_concurrency: Some(CAPACITY),
        ..Registration::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    let tokens: Vec<RegistrationToken> = runtime.block_on(async {
        let mut tokens = Vec::with_capacity(size);
        for _ in 0..size {
            let token = registry
                .admit(&caller, registration.clone(), Arc::new(Sink))
                .await
                .expect("the bench registration is valid");
            tokens.push(token);
        }
        tokens
    });

    let mut ids: Vec<WorkerId> = tokens.iter().map(RegistrationToken::worker_id).collect();
    let saturated_count = size * 9 / 10;
    let saturated: HashSet<WorkerId> = match saturation {
        Saturation::Idle => HashSet::new(),
        Saturation::Contiguous => ids.iter().take(saturated_count).copied().collect(),
        Saturation::Random => {
            ids.shuffle(&mut StdRng::seed_from_u64(0x5eed));
            ids.iter().take(saturated_count).copied().collect()
        }
    };

    // Walk the rotation, keeping the reservations that land on a worker to saturate. Every
    // pass over the pool fills each target by one slot, so CAPACITY + 1 passes always suffice.
    let mut held = Vec::with_capacity(saturated.len() * CAPACITY as usize);
    let wanted = saturated.len() * CAPACITY as usize;
    for _ in 0..(size * (CAPACITY as usize + 1)) {
        if held.len() == wanted {
            break;
        }
        let (worker, reservation) = registry
            .select_and_reserve(NAMESPACE, TASK_QUEUE, ACTIVITY, None)
            .expect("an unsaturated worker remains");
        if saturated.contains(&worker.id()) {
            held.push(reservation);
        }
    }
    assert_eq!(held.len(), wanted, "fixture saturated every chosen worker");
    let census = registry.pool_census(NAMESPACE, TASK_QUEUE, ACTIVITY, None);
    assert_eq!(census.at_capacity, saturated.len());
    assert_eq!(census.eligible, size - saturated.len());

    Fixture {
        registry,
        _tokens: tokens,
        _held: held,
    }
}

fn selection(c: &mut Criterion) {
    let mut group = c.benchmark_group("select_and_reserve");
    for saturation in [Saturation::Idle, Saturation::Random, Saturation::Contiguous] {
        for size in SIZES {
            let fixture = fixture(size, saturation);
            let registry = &fixture.registry;
            group.bench_with_input(BenchmarkId::new(saturation.label(), size), &size, |b, _| {
                b.iter(|| {
                    let hit = registry.select_and_reserve(
                        black_box(NAMESPACE),
                        black_box(TASK_QUEUE),
                        black_box(ACTIVITY),
                        None,
                    );
                    assert!(hit.is_some(), "a pool with eligible workers selects one");
                    drop(black_box(hit));
                });
            });
        }
    }
    group.finish();
}

/// The bench group, spelled out so it carries a doc line (`criterion_group!` cannot).
fn benches() {
    let mut criterion = Criterion::default().configure_from_args();
    selection(&mut criterion);
}

criterion_main!(benches);
