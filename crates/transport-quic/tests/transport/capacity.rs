//! Re-announcing capacity grows and shrinks the worker's share, never cancelling work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use switchyard_core::{ActivityOutcome, UnservedReason, WorkerEvent};
use switchyard_transport_quic::{ActivityContext, ActivityError, QuicWorkerBuilder};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{Gateway, PATIENCE, event, eventually};

/// A handler that reports each start and holds every task until released.
pub(crate) struct Gate {
    pub(crate) started: mpsc::UnboundedReceiver<u64>,
    pub(crate) release: Arc<Semaphore>,
    pub(crate) running: Arc<AtomicUsize>,
}

impl Gate {
    pub(crate) fn install(builder: QuicWorkerBuilder, activity: &str) -> (QuicWorkerBuilder, Self) {
        let (tx, started) = mpsc::unbounded_channel();
        let release = Arc::new(Semaphore::new(0));
        let running = Arc::new(AtomicUsize::new(0));
        let gate = Self {
            started,
            release: Arc::clone(&release),
            running: Arc::clone(&running),
        };
        let builder = builder.activity(activity, move |ctx: ActivityContext, input: Bytes| {
            let (tx, release, running) = (tx.clone(), Arc::clone(&release), Arc::clone(&running));
            async move {
                running.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(ctx.task_id().get());
                let permit = release.acquire().await;
                running.fetch_sub(1, Ordering::SeqCst);
                permit
                    .map_err(|_| ActivityError::retryable("gate closed"))?
                    .forget();
                Ok(input)
            }
        });
        (builder, gate)
    }

    pub(crate) async fn next_start(&mut self) -> u64 {
        tokio::time::timeout(PATIENCE, self.started.recv())
            .await
            .expect("no task started")
            .expect("handler gone")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_announcement_grows_and_shrinks_without_cancelling_running_tasks() {
    let gateway = Arc::new(Gateway::start().await);
    let mut events = gateway.registry().subscribe_events();
    let (builder, mut gate) = Gate::install(gateway.worker().max_concurrency(2), "hold");
    let worker = builder.connect().await.unwrap();
    let handle = worker.handle();
    let id = worker.worker_id();
    tokio::spawn(worker.run());
    event(
        &mut events,
        "capacity 2",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker, capacity: 2 } if *worker == id),
    )
    .await;

    // Grow to 4: four tasks run at once.
    handle.set_max_concurrency(4).unwrap();
    event(
        &mut events,
        "capacity 4",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker, capacity: 4 } if *worker == id),
    )
    .await;
    let mut dispatches = Vec::new();
    for _ in 0..4 {
        let gateway = Arc::clone(&gateway);
        dispatches.push(tokio::spawn(
            async move { gateway.dispatch("hold", b"x").await },
        ));
    }
    for _ in 0..4 {
        gate.next_start().await;
    }
    assert_eq!(gate.running.load(Ordering::SeqCst), 4);

    // Shrink to 1 while four run: nothing is cancelled, the worker is at capacity.
    handle.set_max_concurrency(1).unwrap();
    event(
        &mut events,
        "capacity 1",
        |e| matches!(e, WorkerEvent::CapacityAnnounced { worker, capacity: 1 } if *worker == id),
    )
    .await;
    let snapshot = gateway.registry().worker(id).unwrap();
    assert_eq!((snapshot.capacity, snapshot.in_flight), (Some(1), 4));
    gate.release.add_permits(4);
    for dispatch in dispatches {
        assert_eq!(
            dispatch.await.unwrap(),
            ActivityOutcome::Completed("x".into())
        );
    }

    // Now one at a time: the second dispatch waits while the first runs.
    let first = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("hold", b"1").await }
    });
    gate.next_start().await;
    let second = tokio::spawn({
        let gateway = Arc::clone(&gateway);
        async move { gateway.dispatch("hold", b"2").await }
    });
    eventually("the second dispatch parks at capacity", || {
        gateway
            .core
            .dispatcher()
            .unserved_queues()
            .iter()
            .any(|q| q.reason == UnservedReason::AllAtCapacity)
    })
    .await;
    assert_eq!(gate.running.load(Ordering::SeqCst), 1);
    gate.release.add_permits(1);
    gate.next_start().await;
    gate.release.add_permits(1);
    assert_eq!(first.await.unwrap(), ActivityOutcome::Completed("1".into()));
    assert_eq!(
        second.await.unwrap(),
        ActivityOutcome::Completed("2".into())
    );
}
